"""The save helper process: background saves written from shared memory by a process of their own.

Real processes and real signals: the helper is started as slurmrt starts it, killed, stopped and orphaned."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmrt._comm import SoloComm
from slurmrt.checkpoint import parts
from slurmrt.checkpoint.helper import Helper, available
from slurmrt.checkpoint.store import CheckpointStore

pytestmark = pytest.mark.skipif(not available(), reason="the save helper needs Linux (memfd_create, SCM_RIGHTS)")


class Box:
    """A class the helper process cannot import (as one defined in train.py): its module exists only in this
    process."""

    def __init__(self, value: Any) -> None:
        self.value = value


_ONLY_HERE = types.ModuleType("slurmrt_test_only_here")
_ONLY_HERE.Box = Box  # type: ignore[attr-defined]
sys.modules[_ONLY_HERE.__name__] = _ONLY_HERE
Box.__module__ = _ONLY_HERE.__name__


def _state() -> dict[str, Any]:
    big = torch.randn(256, 1024)
    return {
        "big": big,
        "view": big[3:7],  # shares big's storage
        "t": torch.randn(300, 200).t(),  # not contiguous
        "ints": torch.arange(1000, dtype=torch.int64),
        "half": torch.randn(64, 64).to(torch.bfloat16),
        "empty": torch.empty(0, 5),
        "nested": [torch.ones(3), {"k": torch.zeros(2, 2)}, 7, "text"],
        "box": Box(torch.full((4,), 2.0)),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Box):
        return _same(a.value, b.value)
    return bool(a == b)


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """States of a few MiB are written in parts, as states of 64 MiB and more are (the choice is made in the
    training process, so the patch holds for the helper's writes too)."""
    monkeypatch.setattr(parts, "SPLIT_MIN_BYTES", 1 << 20)


def test_a_background_save_is_written_by_the_helper_and_loads_bitwise_equal(
        tmp_path: Path, split_small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state()
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None and store.helper.start()
    # Part files written by this process would fail: the save succeeds only if the helper wrote them.
    write_state = parts.write_state

    def here(path: Path, obj: Any) -> Any:
        if ".part" in path.name:
            raise AssertionError(f"{path.name} was written by the training process")
        return write_state(path, obj)

    monkeypatch.setattr(parts, "write_state", here)
    store.save(state, 1, blocking=False).wait()
    assert store.helper.pid is not None
    written = sorted(p.name for p in (tmp_path / "step_000000001").iterdir())
    assert [n for n in written if ".part" in n], written
    got = store.load_latest()
    assert got is not None and _same(state, got.state)
    store.close()


def test_views_of_one_storage_stay_one_storage_and_the_buffers_are_reused_until_the_layout_changes(
        tmp_path: Path, split_small: None) -> None:
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None and store.helper.start()
    w = torch.randn(512, 512)
    store.save({"w": w, "tied": w}, 1, blocking=False).wait()
    first = set(store.helper.buffers.segments)
    w.add_(1)
    store.save({"w": w, "tied": w}, 2, blocking=False).wait()
    assert set(store.helper.buffers.segments) == first  # the same layout: the same segment, the new values
    got = store.load_latest()
    assert got is not None and got.step == 2 and torch.equal(got.state["w"], w) and torch.equal(got.state["tied"], w)
    store.save({"w": w, "more": torch.ones(300, 300)}, 3, blocking=False).wait()
    assert set(store.helper.buffers.segments) != first  # another layout: a new segment, the old one released
    got = store.load_latest()
    assert got is not None and got.step == 3 and torch.equal(got.state["more"], torch.ones(300, 300))
    store.close()


def test_the_first_save_does_not_wait_for_the_helper_to_start(tmp_path: Path, split_small: None) -> None:
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None
    store.helper.start_timeout_s = 3600.0
    state = _state()
    with _stopped_helpers():  # a helper that never gets ready: the saves go on without it
        store.save(state, 1, blocking=False).wait()
        store.save(state, 2, blocking=False).wait()
    got = store.load_latest()
    assert got is not None and got.step == 2 and _same(state, got.state)
    assert store.helper.start()  # it does get ready, once it runs
    store.close()


@contextlib.contextmanager
def _stopped_helpers() -> Any:
    """Every helper started inside it is SIGSTOPped at once (before it can be ready), and let go at the end."""
    import slurmrt.checkpoint.helper as module

    started: list[int] = []
    popen = module.subprocess.Popen

    def stopped(*args: Any, **kwargs: Any) -> Any:
        proc = popen(*args, **kwargs)
        os.kill(proc.pid, signal.SIGSTOP)
        started.append(proc.pid)
        return proc

    module.subprocess.Popen = stopped  # type: ignore[misc]
    try:
        yield
    finally:
        module.subprocess.Popen = popen  # type: ignore[misc]
        for pid in started:
            os.kill(pid, signal.SIGCONT)
    assert started, "no helper was started"


def test_helper_writes_a_tensor_outside_shared_memory_by_value_and_keeps_shared_views_shared(tmp_path: Path) -> None:
    helper = Helper(nice=0)
    try:
        assert helper.start()
        (shared,) = helper.buffers.allocate([((64, 8), (8, 1), torch.float32)])
        shared.copy_(torch.randn(64, 8))
        private = torch.randn(5)
        files = helper.write_states(tmp_path, {"a.pt": {"s": shared, "v": shared[10:20], "p": private}})
        assert set(files) == {"a.pt"} and files["a.pt"]["size"] == (tmp_path / "a.pt").stat().st_size
        back = torch.load(tmp_path / "a.pt")
        assert torch.equal(back["s"], shared) and torch.equal(back["v"], shared[10:20])
        assert torch.equal(back["p"], private)
        assert back["v"].untyped_storage().data_ptr() == back["s"].untyped_storage().data_ptr()
    finally:
        helper.shutdown()


@pytest.mark.parametrize("fate", ["killed", "stopped"])
def test_a_helper_lost_during_a_write_leaves_that_save_and_the_next_to_threads(
        tmp_path: Path, split_small: None, fate: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import slurmrt.checkpoint.helper as module

    monkeypatch.setattr(module, "STOPPED_GRACE_S", 0.5)
    state = _state()
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None and store.helper.start()
    store.save(state, 1, blocking=False).wait()
    pid = store.helper.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # it cannot finish what it is sent
    try:
        pending = store.save(state, 2, blocking=False)
        if fate == "killed":
            os.kill(pid, signal.SIGKILL)
        result = store.wait()  # with the watchdog off, nothing else would end this wait
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert pending is not None and result is not None and result.step == 2
    assert caplog.text.count("helper process was lost") == 1, caplog.text
    assert store.helper.pid is None, "the lost helper is ended, not left stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    got = store.load_latest()
    assert got is not None and got.step == 2 and _same(state, got.state)
    store.save(state, 3, blocking=False).wait()  # threads from now on, without a word more
    got = store.load_latest()
    assert got is not None and got.step == 3 and _same(state, got.state)
    assert caplog.text.count("helper process was lost") == 1
    store.close()


def test_the_helper_ignores_slurms_signals_and_runs_below_the_training(tmp_path: Path, split_small: None) -> None:
    state = _state()
    store = CheckpointStore(tmp_path, SoloComm(), nice=5)
    assert store.helper is not None and store.helper.start()
    store.save(state, 1, blocking=False).wait()
    pid = store.helper.pid
    assert pid is not None
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + 5)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        os.kill(pid, sig)
    store.save(state, 2, blocking=False).wait()  # answered by the same process: it ignored them all
    assert store.helper.pid == pid
    got = store.load_latest()
    assert got is not None and got.step == 2 and _same(state, got.state)
    store.close()


def test_the_helper_exits_when_the_training_process_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time, torch
        from pathlib import Path
        from slurmrt._comm import SoloComm
        from slurmrt.checkpoint import parts
        from slurmrt.checkpoint.store import CheckpointStore
        parts.SPLIT_MIN_BYTES = 1 << 20  # 4 MiB written in parts, by the helper
        store = CheckpointStore(Path({str(tmp_path / 'ck')!r}), SoloComm())
        assert store.helper.start()
        store.save({{"w": torch.randn(1 << 20)}}, 1, blocking=False).wait()
        print(store.helper.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        assert _alive(helper)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 120  # a bound on a failure, not a pace: the helper looks twice a second
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(helper)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_save_process_off_writes_from_threads(tmp_path: Path) -> None:
    from slurmrt.options import Options

    assert Options().save_process is True
    assert Options.resolve({}, {"SLURMRT_SAVE_PROCESS": "0"}).save_process is False
    store = CheckpointStore(tmp_path, SoloComm(), process=False)
    assert store.helper is None
    state = _state()
    store.save(state, 1, blocking=False).wait()
    got = store.load_latest()
    assert got is not None and _same(state, got.state)


def test_a_helper_that_cannot_start_leaves_the_save_to_threads(tmp_path: Path, split_small: None,
                                                                caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    state = _state()
    store.save(state, 1, blocking=False).wait()
    assert store.helper.pid is None and "could not be started" in caplog.text
    got = store.load_latest()
    assert got is not None and _same(state, got.state)


def test_a_state_too_small_to_split_is_written_here_and_starts_no_helper(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, SoloComm())
    assert store.helper is not None
    store.save({"w": torch.randn(100), "note": "small"}, 1, blocking=False).wait()
    assert store.helper.pid is None  # one torch.save file, by the save's thread: no process (and its memory) for it
    got = store.load_latest()
    assert got is not None and got.state["note"] == "small"


def test_sharded_state_saved_in_the_background_is_written_by_the_helper_and_reads_back_through_dcp(
        tmp_path: Path) -> None:
    # In a process of its own: DTensors need a process group, which this test process must not keep.
    script = textwrap.dedent(f"""
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from pathlib import Path
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from slurmrt._comm import SoloComm
        from slurmrt.checkpoint.store import CheckpointStore
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'pg'}", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        def state(fill):
            return {{"w": distribute_tensor(fill(64, 32), mesh, [Shard(0)]),
                     "r": distribute_tensor(fill(8), mesh, [Replicate()]), "step": 5, "plain": fill(6)}}
        saved = state(torch.randn)
        store = CheckpointStore(Path({str(tmp_path / 'ck')!r}), SoloComm())
        assert store.helper.start()
        for step in (1, 2):
            store.save(saved, step, blocking=False).wait()
            assert store.helper.pid is not None
        import os, signal
        os.kill(store.helper.pid, signal.SIGSTOP)  # stopped, then killed, in the middle of the next write
        pending = store.save(saved, 3, blocking=False)
        os.kill(store.helper.pid, signal.SIGKILL)
        assert pending.wait().step == 3 and store.helper.lost  # DCP's writer fell back to threads
        store.close()
        into = state(torch.zeros)
        got = store.load_latest(into=into)
        assert got.step == 3 and into["step"] == 5
        for k in ("w", "r"):
            assert torch.equal(into[k].to_local(), saved[k].to_local()), k
        assert torch.equal(into["plain"], saved["plain"])
        alone = {{"w": torch.zeros(64, 32)}}
        dcp.load(alone, checkpoint_id={str(tmp_path / 'ck' / 'step_000000003')!r}, no_dist=True)  # without slurmrt
        assert torch.equal(alone["w"], saved["w"].full_tensor())
        dist.destroy_process_group()
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_an_os_error_in_the_helper_reaches_the_save_as_an_os_error_with_its_errno(tmp_path: Path) -> None:
    """A full disk or a refused write keeps its errno, which the store's advice ("free space in ...") reads."""
    import errno

    from slurmrt.checkpoint._files import failure_advice

    helper = Helper(nice=0)
    try:
        assert helper.start()
        (shared,) = helper.buffers.allocate([((4,), (1,), torch.float32)])
        not_a_directory = tmp_path / "file"
        not_a_directory.write_text("x")
        with pytest.raises(OSError) as raised:
            helper.write_states(not_a_directory, {"a.pt": {"s": shared}})
        assert raised.value.errno == errno.ENOTDIR and "in the save helper process" in str(raised.value)
        full = OSError(errno.ENOSPC, "in the save helper process: No space left on device")
        assert "free space" in failure_advice(full, tmp_path)
        assert helper.write_states(tmp_path, {"b.pt": {"s": shared}})  # the helper lives on after the error
    finally:
        helper.shutdown()
