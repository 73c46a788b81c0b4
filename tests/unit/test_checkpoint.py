"""Checkpoints with one process (SoloComm): completeness, corruption, pruning, background saves."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from slurmrt import CheckpointError
from slurmrt._comm import SoloComm
from slurmrt.checkpoint.store import CheckpointStore, Staged


def _store(root: Path, keep_last: int = 3, keep_every: int | None = None) -> CheckpointStore:
    return CheckpointStore(root, SoloComm(), keep_last=keep_last, keep_every=keep_every)


def _loaded(store: CheckpointStore, **kwargs: Any) -> tuple[int, Any]:
    got = store.load_latest(**kwargs)
    assert got is not None
    return got.step, got.state


def test_fresh_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert _store(tmp_path / "ckpt").load_latest() is None


def test_saved_state_loads_back_with_its_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.arange(4.0), "note": "hi"}, 7)
    step, state = _loaded(store)
    assert step == 7 and state["note"] == "hi" and torch.equal(state["w"], torch.arange(4.0))
    assert (tmp_path / "latest").read_text().strip() == "step_000000007"


def test_a_partial_save_is_invisible(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": 1}, 1)
    partial = tmp_path / ".tmp-step_000000002-x-1"
    partial.mkdir()
    (partial / "rank_00000.pt").write_bytes(b"half")
    assert _loaded(store)[0] == 1


def test_a_truncated_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                 ) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(100)}, 1)
    store.save({"w": torch.ones(100)}, 2)
    part = tmp_path / "step_000000002" / "rank_00000.pt"
    part.write_bytes(part.read_bytes()[:50])
    step, state = _loaded(store)
    assert step == 1 and torch.equal(state["w"], torch.zeros(100))
    assert "unusable" in caplog.text and "truncated" in caplog.text


def test_a_corrupt_file_of_the_right_size_is_skipped(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": 1}, 1)
    store.save({"w": 2}, 2)
    part = tmp_path / "step_000000002" / "rank_00000.pt"
    part.write_bytes(b"\0" * part.stat().st_size)
    assert _loaded(store)[0] == 1


def test_only_the_last_k_checkpoints_are_kept(tmp_path: Path) -> None:
    store = _store(tmp_path, keep_last=2)
    for step in range(5):
        store.save({"s": step}, step)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000003", "step_000000004"]


def test_non_blocking_save_snapshots_the_state_before_it_changes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    w = torch.zeros(1000)
    store.save({"w": w}, 3, blocking=False)
    w += 1  # training goes on while the background thread writes
    store.wait()
    assert torch.equal(_loaded(store)[1]["w"], torch.zeros(1000))


def test_callable_saves_get_a_directory_and_load_returns_it(tmp_path: Path) -> None:
    store = _store(tmp_path)

    def framework_saver(directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "model" / "weights.bin").write_bytes(b"x" * 10)

    store.save(framework_saver, 5)
    step, path = _loaded(store)
    assert step == 5 and (path / "model" / "weights.bin").read_bytes() == b"x" * 10
    assert json.loads((path / "manifest.json").read_text())["files"] == {
        "model/weights.bin": {"size": 10, "xxh3_64": xxhash.xxh3_64(b'x' * 10).hexdigest()}}


def test_a_failing_write_raises_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": 1}, 1)

    def broken(directory: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoint is intact|"
                                              "previous checkpoint is intact.*No space left"):
        store.save(broken, 2)
    assert _loaded(store)[0] == 1
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_background_save_error_surfaces_on_the_training_thread(tmp_path: Path) -> None:
    store = _store(tmp_path)

    def broken(snapshot: Any, directory: Path) -> None:
        raise OSError(13, "Permission denied")

    store.save(Staged(lambda: None, broken), 1, blocking=False)
    with pytest.raises(CheckpointError, match="Permission denied"):
        store.wait()


def test_a_plain_save_function_is_refused_in_the_background_and_nothing_is_written(tmp_path: Path) -> None:
    """Its collectives (a framework saver's) would run beside the training thread's: refused, with the fix."""
    store = _store(tmp_path)
    calls: list[Path] = []
    with pytest.raises(CheckpointError, match=r"blocking=True, or pass slurmrt.Staged"):
        store.save(calls.append, 1, blocking=False)
    assert calls == [] and store.pending is None and not list(tmp_path.iterdir())


def test_a_staged_save_snapshots_on_the_calling_thread_and_writes_in_the_background(tmp_path: Path) -> None:
    import threading

    store = _store(tmp_path)
    threads: dict[str, str] = {}
    live = {"w": 1}

    def snapshot() -> dict[str, int]:
        threads["snapshot"] = threading.current_thread().name
        return dict(live)

    def write(snap: dict[str, int], directory: Path) -> None:
        threads["write"] = threading.current_thread().name
        (directory / "w.json").write_text(json.dumps(snap))

    store.save(Staged(snapshot, write), 4, blocking=False)
    live["w"] = 2  # training goes on: the snapshot was taken
    store.wait()
    assert threads == {"snapshot": threading.current_thread().name, "write": "slurmrt-save-write"}
    step, path = _loaded(store)
    assert step == 4 and json.loads((path / "w.json").read_text()) == {"w": 1}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a per-thread nice value is Linux's")
def test_a_background_write_and_the_writers_it_starts_run_below_the_trainings_priority_its_commit_does_not(
        tmp_path: Path) -> None:
    import os
    import threading

    from slurmrt.checkpoint.background import NICE

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: dict[str, int] = {}

    def write(snap: None, directory: Path) -> None:
        seen["write"] = nice()
        writer = threading.Thread(target=lambda: seen.setdefault("writer", nice()))  # as DCP's writer threads
        writer.start()
        writer.join()
        (directory / "x").write_text("x")

    training = nice()
    lowered = min(19, training + NICE)
    store = _store(tmp_path)
    commit = store._commit

    def spy(*args: Any) -> bool:
        seen["commit"] = nice()
        return commit(*args)

    store._commit = spy  # type: ignore[method-assign]
    store.save(Staged(lambda: None, write), 1, blocking=False)
    store.wait()
    assert seen == {"write": lowered, "writer": lowered, "commit": training}
    assert nice() == training  # the training thread's own is untouched
    seen.clear()
    store.save(Staged(lambda: None, write), 2)  # blocking: on the calling thread, at its priority
    assert seen == {"write": training, "writer": training, "commit": training}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a per-thread nice value is Linux's")
def test_save_nice_0_leaves_a_background_write_at_the_trainings_priority_and_the_default_is_the_stores(
        tmp_path: Path) -> None:
    import os
    import threading

    from slurmrt.checkpoint.background import NICE
    from slurmrt.options import Options

    seen: list[int] = []

    def write(snap: None, directory: Path) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        (directory / "x").write_text("x")

    store = CheckpointStore(tmp_path, SoloComm(), nice=0)
    store.save(Staged(lambda: None, write), 1, blocking=False)
    store.wait()
    assert seen == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]
    assert Options().save_nice == NICE
    assert Options.resolve({}, {"SLURMRT_SAVE_NICE": "3"}).save_nice == 3


def test_a_background_write_error_reaches_the_training_thread_as_the_write_raised_it(tmp_path: Path) -> None:
    def broken(snap: None, directory: Path) -> None:
        raise ValueError("unpicklable")

    store = _store(tmp_path)
    store.save(Staged(lambda: None, broken), 1, blocking=False)
    with pytest.raises(CheckpointError, match="unpicklable"):
        store.wait()
    assert store.load_latest() is None


def test_a_checkpoint_from_another_world_size_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": 1}, 1)
    manifest = tmp_path / "step_000000001" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["world_size"] = 4
    manifest.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="written by 4 ranks and this run has 1"):
        store.load_latest()  # never a silent fresh start that would later prune the real progress


@pytest.mark.parametrize(("err", "fix"), [
    (OSError(28, "No space left on device"), "fix: free space"),
    (RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0"), "fix: free space"),
    (OSError(13, "Permission denied"), "fix: let the job write to"),
    (AssertionError("Torch not compiled with CUDA enabled"), None),
])
def test_a_save_error_names_a_fix_only_where_one_is_known(tmp_path: Path, err: Exception, fix: str | None) -> None:
    store = _store(tmp_path)

    def broken(directory: Path) -> None:
        raise err

    with pytest.raises(CheckpointError) as info:
        store.save(broken, 1)
    message = str(info.value)
    assert repr(err) in message and "traceback is in the failing rank's log" in message
    assert ("fix:" not in message) if fix is None else (fix in message)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01  # one bit: the size stays, torch.load may well succeed
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_tensor_is_caught_by_the_checksum_and_the_previous_checkpoint_loads(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(1000)}, 1)
    store.save({"w": torch.ones(1000)}, 2)
    part = tmp_path / "step_000000002" / "rank_00000.pt"
    raw = part.read_bytes()
    _flip(part, raw.index(torch.ones(1000).numpy().tobytes()) + 2000)  # inside the tensor's bytes
    # Without the checksum the damage is invisible: the file loads, with a wrong weight.
    step, state = _loaded(store, verify=False)
    assert step == 2 and not torch.equal(state["w"], torch.ones(1000))
    step, state = _loaded(store)
    assert step == 1 and torch.equal(state["w"], torch.zeros(1000))
    assert "unusable" in caplog.text and "rank_00000.pt: checksum" in caplog.text


def test_slurmrt_verify_names_the_damaged_file_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slurmrt.cli import main

    store = _store(tmp_path)
    store.save({"w": torch.zeros(100)}, 1)
    store.save(lambda d: (d / "model").mkdir() or (d / "model" / "weights.bin").write_bytes(b"x" * 64), 2)
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count(": ok") == 2
    _flip(tmp_path / "step_000000002" / "model" / "weights.bin", 10)
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "step_000000002: DAMAGED" in out and "model/weights.bin: checksum" in out and "step_000000001: ok" in out
    assert main(["verify", str(tmp_path), "--json"]) == 1  # the same findings, as data
    found = json.loads(capsys.readouterr().out)
    assert found["schema"] == "slurmrt.verify/1" and found["ok"] is False
    assert [(c["path"].rsplit("/", 1)[1], c["status"]) for c in found["checkpoints"]] == [
        ("step_000000002", "damaged"), ("step_000000001", "ok")]
    assert "model/weights.bin: checksum" in found["checkpoints"][0]["problems"][0]
    assert main(["verify", str(tmp_path / "step_000000001")]) == 0
    (tmp_path / "step_000000001" / "rank_00000.pt").unlink()
    assert main(["verify", str(tmp_path / "step_000000001")]) == 1
    assert "rank_00000.pt is missing" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "nothing")]) == 2


def test_milestones_survive_pruning_and_the_newest_are_kept_besides(tmp_path: Path) -> None:
    store = _store(tmp_path, keep_last=2, keep_every=10)
    for step in range(0, 35, 5):
        store.save({"s": step}, step)
    kept = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("step_*"))
    assert kept == [0, 10, 20, 25, 30]


def test_rank_local_state_comes_back_with_the_checkpoint(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rng = torch.get_rng_state()
    store.save({"w": torch.ones(3)}, 1, local={"rng": rng, "batch": 17})
    store.save(lambda d: (d / "x").write_text("x"), 2, local={"batch": 34})
    got = store.load_latest()
    assert got is not None and got.step == 2 and got.local == {"batch": 34} and got.local_lost is None
    shutil.rmtree(tmp_path / "step_000000002")
    got = store.load_latest()
    assert got is not None and torch.equal(got.local["rng"], rng) and got.local["batch"] == 17


def test_background_saves_reuse_their_host_buffers_and_each_writes_its_own_snapshot(tmp_path: Path) -> None:
    store = _store(tmp_path)
    w = torch.zeros(1000)
    store.save({"w": w, "note": ["a"]}, 1, blocking=False)
    store.wait()
    buffer = store._stager._buffers[("w",)]
    w += 1
    store.save({"w": w, "note": ["b"]}, 2, blocking=False)
    w += 1  # after the snapshot: not in checkpoint 2
    store.wait()
    assert store._stager._buffers[("w",)] is buffer  # no new allocation for the same shapes
    step, state = _loaded(store)
    assert step == 2 and torch.equal(state["w"], torch.ones(1000)) and state["note"] == ["b"]


def test_a_pruned_checkpoint_leaves_the_committed_set_before_any_of_its_files_is_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILL can land at any unlink of the pruning: at every one, the checkpoint being deleted must no longer
    look committed (a manifest that outlived some of its files was seen in the SIGKILL trials)."""
    import os

    from slurmrt.checkpoint.store import complete_steps

    store = _store(tmp_path, keep_last=1)
    store.save({"w": torch.zeros(10)}, 1, local={"rng": 1})
    seen: list[list[int]] = []
    unlink = os.unlink

    def watched(path: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(complete_steps(tmp_path))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", watched)
    store.save({"w": torch.ones(10)}, 2, local={"rng": 2})
    store.close()  # the files are unlinked in the background
    monkeypatch.undo()
    assert seen, "the pruning deleted nothing"
    assert all(steps == [2] for steps in seen), seen
    assert complete_steps(tmp_path) == [2] and not list(tmp_path.glob(".tmp-step_*"))


def test_pruning_is_off_the_saves_critical_path_and_done_by_close(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The save returns with the pruned checkpoint out of sight while its files are still being deleted; close()
    waits for the deletion."""
    import threading

    from slurmrt.checkpoint import retention
    from slurmrt.checkpoint.store import complete_steps

    store = _store(tmp_path, keep_last=1)
    store.save({"w": torch.zeros(10)}, 1)
    release, started = threading.Event(), threading.Event()
    remove = retention.remove_entry

    def slow(path: Any) -> None:
        started.set()
        release.wait(30)
        remove(path)

    monkeypatch.setattr(retention, "remove_entry", slow)
    store.save({"w": torch.ones(10)}, 2)  # returns although the deletion of step 1 is held
    assert started.wait(30), "the deletion never started"
    assert complete_steps(tmp_path) == [2], "the pruned checkpoint is out of sight at once"
    assert list(tmp_path.glob(".tmp-step_000000001-*-pruned")), "its files are still there, being deleted"
    release.set()
    store.close()
    assert not list(tmp_path.glob(".tmp-step_*"))


def test_a_resumed_run_never_writes_into_an_earlier_attempts_half_written_directory(tmp_path: Path) -> None:
    """Outside Slurm every run has the same token, so its first save has the name of an earlier run's first save:
    load_latest() removes what a SIGKILL left before any rank saves again."""
    first = CheckpointStore(tmp_path, SoloComm(), token="local-r0")
    first.save({"w": 1}, 1)
    stale = tmp_path / ".tmp-step_000000002-local-r0-1"  # a killed run's first save, of the step after
    stale.mkdir()
    (stale / "rank_00007.pt").write_bytes(b"half")
    second = CheckpointStore(tmp_path, SoloComm(), token="local-r0")
    got = second.load_latest()
    assert got is not None and got.step == 1 and not stale.exists()
    second.save({"w": 2}, 2)  # its first save: that same name
    assert sorted(p.name for p in (tmp_path / "step_000000002").iterdir()) == ["manifest.json", "rank_00000.pt"]


def test_a_checkpoint_that_cannot_be_pruned_is_kept_and_the_new_one_is_still_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import os

    store = _store(tmp_path, keep_last=1)
    store.save({"w": 1}, 1)
    rename = os.rename

    def refusing(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if str(dst).endswith("-pruned"):
            raise PermissionError(13, "Permission denied", str(src))
        rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refusing)
    result = store.save({"w": 2}, 2)
    monkeypatch.undo()
    assert result.step == 2 and _loaded(store) == (2, {"w": 2})
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000001", "step_000000002"]
    assert "step_000000001 could not be pruned, it is kept" in caplog.text


def test_a_state_file_is_written_without_torchs_zip_crc_and_the_option_is_put_back(tmp_path: Path) -> None:
    """slurmrt's XXH3 already covers the bytes: torch's CRC-32 is skipped while slurmrt writes, then restored."""
    import zipfile

    from torch import serialization

    store = _store(tmp_path)
    before = serialization.get_crc32_options()
    store.save({"w": torch.arange(1000.0)}, 1)
    assert serialization.get_crc32_options() == before
    (part,) = (tmp_path / "step_000000001").glob("rank_*.pt")
    with zipfile.ZipFile(part) as z:
        data = [i for i in z.infolist() if "/data/" in i.filename]
        assert data and all(i.CRC == 0 for i in data), [(i.filename, i.CRC) for i in data]
    got = store.load_latest()
    assert got is not None and torch.equal(got.state["w"], torch.arange(1000.0))


def test_each_rank_looks_at_its_share_of_the_files_only(tmp_path: Path) -> None:
    """At a resume each rank stats (and verifies) every world_size-th file, not all of them: the ranks' problems are
    gathered, so every rank still hears of a damaged file in another's share."""
    from slurmrt.checkpoint.manifest import check_files, read_manifest

    store = _store(tmp_path)
    store.save(lambda d: [(d / f"f{i}").write_bytes(bytes([i]) * 10) for i in range(4)], 1)
    path = tmp_path / "step_000000001"
    (path / "f3").write_bytes(b"short")
    manifest = read_manifest(path)
    names = sorted(manifest["files"])
    shares = [names[r::2] for r in range(2)]
    seen = [check_files(path, manifest, checksums=share, only=share) for share in shares]
    owner = next(r for r in range(2) if "f3" in shares[r])
    assert seen[owner] and "f3" in seen[owner][0] and not seen[1 - owner]
    assert check_files(path, manifest) == seen[owner], "a check of everything finds the same"


def test_pruning_after_the_broadcast_never_deletes_the_next_save_another_rank_is_writing(tmp_path: Path) -> None:
    """Rank 0 prunes after the commit's broadcast: by then another rank may be writing the next save (a stop right
    after a periodic save) into this attempt's next temporary directory. Only earlier attempts' leftovers go."""
    from slurmrt.checkpoint.store import complete_steps

    store = CheckpointStore(tmp_path, SoloComm(), keep_last=1, token="77-r1")
    store.save({"w": torch.zeros(3)}, 1)
    next_save = tmp_path / ".tmp-step_000000003-77-r1-3"  # the save after the next, as rank 1 starts it
    next_save.mkdir()
    (next_save / "rank_00001.pt").write_bytes(b"rank 1's part")
    earlier = tmp_path / ".tmp-step_000000009-77-r0-4"  # what a SIGKILLed earlier run of the job left
    earlier.mkdir()
    (earlier / "rank_00000.pt").write_bytes(b"half")
    store.save({"w": torch.ones(3)}, 2)  # commits, then prunes step 1
    store.close()
    assert complete_steps(tmp_path) == [2]
    assert (next_save / "rank_00001.pt").read_bytes() == b"rank 1's part"
    assert not earlier.exists()


def test_a_saves_result_says_how_long_it_held_the_training_a_background_write_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock moves only where the test moves it: the snapshot, on the training thread, takes 1 s; the write
    100 s. A blocking save holds the training for both; a background one for the snapshot alone, its write going
    on after the call returned (it waits for the test to let it begin)."""
    import threading

    from slurmrt import _clock

    now = [0.0]
    monkeypatch.setattr(_clock, "mono", lambda: now[0])
    begin = threading.Event()

    def snapshot() -> None:
        now[0] += 1.0

    def write(snap: None, directory: Path) -> None:
        assert begin.wait(timeout=60)
        now[0] += 100.0
        (directory / "x").write_text("x")

    store = _store(tmp_path)
    begin.set()
    blocking = store.save(Staged(snapshot, write), 1)
    assert blocking.stall == pytest.approx(101.0) and blocking.seconds == pytest.approx(100.0)
    begin.clear()
    store.save(Staged(snapshot, write), 2, blocking=False)
    begin.set()  # the call has returned: the write may begin
    background = store.wait()
    assert background is not None and background.stall == pytest.approx(1.0)
    assert background.seconds == pytest.approx(100.0)
