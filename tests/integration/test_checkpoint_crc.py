"""torch's zip CRC-32 is skipped in every thread that writes a checkpoint, slurmrt's and DCP's.

slurmrt's XXH3 in the manifest covers the bytes, so torch's CRC-32 of every record (a quarter of torch.save's time)
is turned off while slurmrt writes. torch 2.13 keeps that option per thread: turned off in the thread that starts a
save, it was still on in DCP's writer threads, in the helper process's, and in part writers that started while
another write held it."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from slurmrt._comm import SoloComm
from slurmrt.checkpoint import parts
from slurmrt.checkpoint._files import no_zip_crc
from slurmrt.checkpoint.helper import available
from slurmrt.checkpoint.store import CheckpointStore


def _data_crcs(archive: bytes) -> list[int]:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return [i.CRC for i in z.infolist() if "/data/" in i.filename]


def test_every_part_writer_skips_the_crc_while_another_slurmrt_write_runs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The part files are written by threads of their own while this thread, as a background save would, already
    holds the option off."""
    from torch import serialization

    monkeypatch.setattr(parts, "SPLIT_MIN_BYTES", 1024)
    store = CheckpointStore(tmp_path, SoloComm(), threads=4)
    state = {f"t{i}": torch.randn(64, 64) for i in range(8)}
    before = serialization.get_crc32_options()
    with no_zip_crc():
        store.save(state, 1)
    assert serialization.get_crc32_options() == before
    files = sorted((tmp_path / "step_000000001").iterdir())
    archives = [f for f in files if zipfile.is_zipfile(f)]
    assert len(archives) >= 5, files  # the main file and 4 parts
    crcs = [c for f in archives for c in _data_crcs(f.read_bytes())]
    assert crcs and all(c == 0 for c in crcs), crcs
    got = store.load_latest()
    assert got is not None and all(torch.equal(got.state[k], v) for k, v in state.items())


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_every_dcp_item_is_written_without_the_crc_and_loads_through_dcp(tmp_path: Path, blocking: bool) -> None:
    """Each item of each rank file (a torch.save archive at the offset DCP's metadata gives) has no CRC, whether
    DCP's 4 writer threads wrote it or, in the background, the save helper's; dcp.load reads the files as any."""
    if not blocking and not available():
        pytest.skip("the save helper needs Linux")
    # In a process of its own: DTensors need a process group, which this test process must not keep.
    script = textwrap.dedent(f"""
        import io, zipfile
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from pathlib import Path
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from slurmrt._comm import SoloComm
        from slurmrt.checkpoint.store import CheckpointStore
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'pg'}", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        saved = {{f"w{{i}}": distribute_tensor(torch.randn(64, 32), mesh, [Shard(0)]) for i in range(8)}}
        store = CheckpointStore(Path({str(tmp_path / 'ck')!r}), SoloComm(), threads=4)
        if {not blocking}:
            assert store.helper.start()
        store.save(saved, 1, blocking={blocking})
        store.wait()
        if {not blocking}:
            assert store.helper.pid is not None
        store.close()
        where = Path({str(tmp_path / 'ck' / 'step_000000001')!r})
        storage = dcp.FileSystemReader(where).read_metadata().storage_data
        files = {{info.relative_path for info in storage.values()}}
        assert len(files) == 4, files  # one per writer thread
        crcs = []
        for info in storage.values():
            blob = (where / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
            with zipfile.ZipFile(io.BytesIO(blob)) as z:
                crcs += [i.CRC for i in z.infolist() if "/data/" in i.filename]
        assert len(crcs) == 8 and all(c == 0 for c in crcs), crcs
        alone = {{k: torch.zeros(64, 32) for k in saved}}
        dcp.load(alone, checkpoint_id=where, no_dist=True)  # without slurmrt
        assert all(torch.equal(alone[k], saved[k].full_tensor()) for k in saved)
        dist.destroy_process_group()
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_the_probe_finds_torchs_option_per_thread_and_leaves_it_as_it_was() -> None:
    from torch import serialization

    from slurmrt.checkpoint import _files

    before = serialization.get_crc32_options()
    _files._crc_option_per_thread.cache_clear()
    try:
        assert _files._crc_option_per_thread() is True  # torch 2.13: its serialization config is per thread
    finally:
        _files._crc_option_per_thread.cache_clear()
    assert serialization.get_crc32_options() == before


def test_where_the_option_is_the_processs_it_is_off_while_any_write_runs_and_put_back_after_the_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An older torch's process-wide option, played by one value shared by all threads: two writes that overlap
    keep it off until the second ends, then the value found before the first comes back."""
    import threading

    from torch import serialization

    from slurmrt.checkpoint import _files

    option = {"crc": True}
    monkeypatch.setattr(serialization, "get_crc32_options", lambda: option["crc"])
    monkeypatch.setattr(serialization, "set_crc32_options", lambda value: option.update(crc=value))
    monkeypatch.setattr(_files, "_crc_option_per_thread", lambda: False)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def second() -> None:
        first_in.wait()
        with no_zip_crc():
            second_in.set()
            first_out.wait()
            seen.append(option["crc"])  # the first write has ended; this one still runs

    t = threading.Thread(target=second)
    t.start()
    with no_zip_crc():
        first_in.set()
        second_in.wait()
        seen.append(option["crc"])
    first_out.set()
    t.join()
    assert seen == [False, False] and option["crc"] is True
