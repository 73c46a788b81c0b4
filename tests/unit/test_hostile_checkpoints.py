"""Damaged checkpoints and a second job on the same directory: nothing sound is lost, nothing damaged is loaded.

Each test here failed on the main before the "nothing lost, nobody in" issue.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrt import CheckpointError, LeaseError
from slurmrt._comm import SoloComm
from slurmrt.checkpoint import holder as holder_module
from slurmrt.checkpoint import lease as lease_module
from slurmrt.checkpoint.lease import LEASE_FILE, Lease
from slurmrt.checkpoint.manifest import manifest_problems, verify
from slurmrt.checkpoint.store import CheckpointStore
from slurmrt.cli import main


def _store(root: Path, keep_last: int = 3, guard: Callable[[], None] | None = None) -> CheckpointStore:
    return CheckpointStore(root, SoloComm(), keep_last=keep_last, guard=guard)


def _flip(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _resume(root: Path, **kwargs: Any) -> tuple[CheckpointStore, int | None, Any]:
    """A new run on ``root``: its store, and the step and state it resumes from."""
    store = _store(root, **kwargs)
    got = store.load_latest()
    return store, (got.step if got else None), (got.state if got else None)


# -- a damaged checkpoint is replaced, never kept, never counted --------------------------------------------------

def test_a_sound_save_replaces_a_damaged_committed_checkpoint_of_its_step(tmp_path: Path) -> None:
    first = _store(tmp_path)
    first.save({"w": torch.full((4,), 1.0)}, 1)
    first.save({"w": torch.full((4,), 2.0)}, 2)
    _flip(tmp_path / "step_000000002" / "rank_00000.pt")
    store, step, _ = _resume(tmp_path)
    assert step == 1
    store.save({"w": torch.full((4,), 2.5)}, 2)  # the resumed run reaches step 2 again
    _, step, state = _resume(tmp_path)
    assert step == 2 and torch.equal(state["w"], torch.full((4,), 2.5))
    assert verify(tmp_path / "step_000000002") == []


def test_a_run_keeps_its_own_checkpoint_when_it_saves_the_same_step_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.full((4,), 1.0)}, 3)
    store.save({"w": torch.full((4,), 9.0)}, 3)  # the stop save at the step of a periodic one: same state
    _, step, state = _resume(tmp_path)
    assert step == 3 and torch.equal(state["w"], torch.full((4,), 1.0))


def test_pruning_never_deletes_the_newest_sound_checkpoint_when_the_newest_ones_are_damaged(tmp_path: Path) -> None:
    first = _store(tmp_path, keep_last=3)  # the next run keeps 2: three on disk, step 0 the only sound one
    for step in range(3):
        first.save({"w": torch.full((4,), float(step))}, step)
    for step in (1, 2):
        _flip(tmp_path / f"step_{step:09d}" / "rank_00000.pt")
    store, step, _ = _resume(tmp_path, keep_last=2)
    assert step == 0
    store.save({"w": torch.full((4,), 1.5)}, 1)  # replaces the damaged step 1; the damaged step 2 counts for nothing
    assert (tmp_path / "step_000000000").is_dir(), "pruning deleted a sound checkpoint inside keep_last"
    _, step, state = _resume(tmp_path)
    assert step == 1 and torch.equal(state["w"], torch.full((4,), 1.5))


def test_a_manifest_that_lists_no_file_is_damage_not_a_checkpoint(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.ones(4)}, 1)
    store.save({"w": torch.ones(4)}, 2)
    manifest = tmp_path / "step_000000002" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"] = {}
    manifest.write_text(json.dumps(data))
    weights = tmp_path / "step_000000002" / "rank_00000.pt"
    torch.save({"w": torch.full((4,), 1.0000001)}, weights)  # corrupted weights that nothing lists any more
    _, step, state = _resume(tmp_path)
    assert step == 1 and torch.equal(state["w"], torch.ones(4))
    assert main(["verify", str(tmp_path / "step_000000002")]) == 1
    assert "lists no file" in capsys.readouterr().out


@pytest.mark.parametrize("files", [[], "rank_00000.pt", {"rank_00000.pt": "12"}, {"rank_00000.pt": {"size": -1}},
                                   {"../../etc/passwd": {"size": 1, "xxh3_64": "0" * 16}}, None])
def test_a_manifest_whose_files_have_the_wrong_type_is_damage(tmp_path: Path, files: Any) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.ones(4)}, 1)
    store.save({"w": torch.zeros(4)}, 2)
    manifest = tmp_path / "step_000000002" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"] = files
    manifest.write_text(json.dumps(data))
    assert _resume(tmp_path)[1] == 1
    assert verify(tmp_path / "step_000000002")  # a problem, named, not an exception


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=5), max_leaves=20))
def test_any_json_value_as_a_manifest_gives_problems_never_an_exception(value: Any) -> None:
    problems = manifest_problems(value, Path("step_000000001"))
    assert isinstance(problems, list)


def _save_with_every_kind(root: Path) -> None:
    store = _store(root, keep_last=5)
    store.save({"w": torch.full((64,), 1.0)}, 1, local={"rng": 1})
    store.save({"w": torch.full((64,), 2.0)}, 2, local={"rng": 2})


def test_every_byte_of_a_manifest_flipped_is_caught(tmp_path: Path) -> None:
    _save_with_every_kind(tmp_path)
    manifest = tmp_path / "step_000000002" / "manifest.json"
    original = manifest.read_bytes()
    for offset in range(len(original)):
        data = bytearray(original)
        data[offset] ^= 0x01
        manifest.write_bytes(bytes(data))
        assert verify(tmp_path / "step_000000002"), f"byte {offset} ({chr(original[offset])!r}) flipped: sound?"
    manifest.write_bytes(original)
    assert verify(tmp_path / "step_000000002") == []


def test_a_full_disk_at_the_latest_update_reports_the_committed_save_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(4)}, 1)
    real = os.replace

    def full(src: Any, dst: Any) -> None:
        if Path(dst).name == "latest":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", full)
    result = store.save({"w": torch.ones(4)}, 2)  # committed: no error may say otherwise
    monkeypatch.setattr(os, "replace", real)
    assert result.step == 2
    assert "is committed, but `latest` could not be updated" in caplog.text
    assert "previous one is intact" not in caplog.text
    assert list(tmp_path.glob(".latest.*")) == []
    _, step, state = _resume(tmp_path)
    assert step == 2 and torch.equal(state["w"], torch.ones(4))


def test_a_temporary_latest_file_left_by_a_kill_is_gone_after_the_next_save(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(4)}, 1)
    (tmp_path / ".latest.4242.tmp").write_text("step_000000001\n")
    (tmp_path / ".latest.4242.deadbeef.tmp").write_text("step_000000001\n")
    store.save({"w": torch.zeros(4)}, 2)
    assert list(tmp_path.glob(".latest.*")) == []


# -- one live job per directory ---------------------------------------------------------------------------------

def _lease(root: Path, owner: str, *, alive: bool | None = True, host: str = "n1", quiet_s: float = 0.2,
           cluster: str | None = None) -> Lease:
    return Lease(root, owner=owner, job=owner, host=host, cluster=cluster, quiet_s=quiet_s,
                 alive=lambda job, cluster: alive)


def test_a_second_job_on_a_live_jobs_directory_is_refused_with_its_id_place_and_fix(tmp_path: Path) -> None:
    _lease(tmp_path, "7001").acquire()
    second = _lease(tmp_path, "7002", host="n9")
    with pytest.raises(LeaseError, match=r"in use by job 7001 \(on n1, pid \d+.*scancel 7001.*own checkpoint_dir"):
        second.acquire()
    with pytest.raises(LeaseError, match="7001"):
        second.check()  # every rank of the second job, not only its rank 0
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == "7001"


def test_a_rank_that_found_the_lease_live_follows_its_rank_0_taking_it_over(tmp_path: Path) -> None:
    _lease(tmp_path, "7001", host="n2").acquire()
    rank1 = _lease(tmp_path, "7002")  # judges 7001 live: waits for rank 0's decision before refusing
    taker = threading.Timer(0.3, lambda: _lease(tmp_path, "7002", alive=False).acquire())  # rank 0: 7001 ended
    taker.start()
    try:
        assert rank1.check(leader_wait_s=60) is None
    finally:
        taker.join()
    with pytest.raises(LeaseError, match="in use by job 7002"):
        _lease(tmp_path, "7003").check(leader_wait_s=0.6)  # rank 0 refused (never took it): the others refuse too


def test_a_requeued_run_of_the_same_job_continues_with_the_directory(tmp_path: Path) -> None:
    _lease(tmp_path, "7001").acquire()
    again = _lease(tmp_path, "7001", host="n3")
    again.acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["host"] == "n3"


def _step(root: Path, step: str, *, run: str = "0.0", host: str = "n1", quiet_s: float = 30.0) -> Lease:
    return Lease(root, owner="7001", job="7001", host=host, step=step, run=run, quiet_s=quiet_s,
                 alive=lambda job, cluster: True)


def test_two_steps_of_one_job_on_one_directory_are_refused_like_two_jobs(tmp_path: Path) -> None:
    first = _step(tmp_path, "0")
    first.acquire()
    refused = r"job 7001 \(step 0\).*another step of this job.*one training step"
    with pytest.raises(LeaseError, match=refused):
        _step(tmp_path, "1", host="n1").acquire()  # alive on this host
    with _beating(first), pytest.raises(LeaseError, match=refused):
        _step(tmp_path, "1", host="n2", quiet_s=5.0).acquire()  # on another host, its heartbeat moving
    first.guard()  # the first step still holds it, and may commit
    _step(tmp_path, "0", run="1.0", host="n3").acquire()  # a requeued run (restart 1): that step has ended
    assert json.loads((tmp_path / LEASE_FILE).read_text())["run"] == "1.0"
    _step(tmp_path, "2", run="1.1", host="n4").acquire()  # an in-job restart's new step: the last one ended


def test_a_step_of_the_same_job_that_stopped_beating_on_another_host_is_taken_over(tmp_path: Path) -> None:
    _step(tmp_path, "0", host="n2").acquire()  # SIGKILLed on n2: its heartbeat stands still
    _step(tmp_path, "1", host="n1", quiet_s=0.2).acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["step"] == "1"


def test_the_next_array_task_takes_the_directory_once_the_holder_released_it(tmp_path: Path) -> None:
    first = _lease(tmp_path, "4711_1")
    first.acquire()
    first.release()
    assert not (tmp_path / LEASE_FILE).exists()
    _lease(tmp_path, "4711_2").acquire()


def test_a_lease_whose_job_slurm_says_ended_is_taken_over_with_a_warning(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    _lease(tmp_path, "4711_1", host="n2").acquire()  # SIGKILLed: never released
    _lease(tmp_path, "4711_2", alive=False, host="n5").acquire()
    assert "Slurm says job 4711_1 has ended" in caplog.text
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == "4711_2"


@contextlib.contextmanager
def _beating(holder: Lease) -> Iterator[None]:
    """The holder's watcher, refreshing its heartbeat as a live job's does, for as long as the block runs."""
    done = threading.Event()

    def beat() -> None:
        while not done.is_set():
            holder._next_refresh = 0.0
            holder.refresh()
            time.sleep(0.02)

    refresher = threading.Thread(target=beat)
    refresher.start()
    try:
        yield
    finally:
        done.set()
        refresher.join()


def test_a_holder_alive_on_this_host_is_never_taken_over_whatever_slurm_answers(tmp_path: Path) -> None:
    # squeue of a Slurm that does not know job 7001 says "Invalid job id": no evidence against a live process.
    _lease(tmp_path, "7001", host="n1").acquire()
    with pytest.raises(LeaseError, match="in use by job 7001"):
        _lease(tmp_path, "7002", alive=False, host="n1", quiet_s=0.0).acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == "7001"


def test_a_heartbeat_that_moves_outweighs_slurm_saying_the_job_ended(tmp_path: Path) -> None:
    holder = _lease(tmp_path, "7001", host="n2")
    holder.acquire()
    with _beating(holder), pytest.raises(LeaseError, match="in use by job 7001"):
        _lease(tmp_path, "7002", alive=False, host="n5", quiet_s=5.0).acquire()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == "7001"


def test_slurm_is_asked_on_the_holders_own_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, ...]] = []
    invalid = (1, "", "slurm_load_jobs error: Invalid job id specified")
    answers = {"east": (0, "CLUSTER: east\nRUNNING\n", ""), "": invalid}

    def run(command: str, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        asked.append((command, *args))
        code, out, err = answers[args[1] if args[0] == "-M" else ""]
        return subprocess.CompletedProcess([command, *args], code, out, err)

    monkeypatch.setattr(holder_module._slurm, "run", run)
    Lease(tmp_path, owner="7001", job="7001", host="e1", cluster="east").acquire()  # SIGKILLed on cluster east
    west = Lease(tmp_path, owner="7002", job="7002", host="w1", cluster="west", quiet_s=0.1)
    with pytest.raises(LeaseError, match="in use by job 7001"):
        west.acquire()  # west's squeue does not know 7001; east, asked with -M, says it runs
    assert asked and all(call[:3] == ("squeue", "-M", "east") for call in asked), asked
    answers["east"] = (1, "", "squeue: error: 'east' can't be reached now")
    with pytest.raises(LeaseError, match="in use by job 7001"):
        west.acquire()  # no answer is no evidence
    answers["east"] = invalid
    west.acquire()  # east itself no longer knows the job, and the heartbeat has stood still
    assert json.loads((tmp_path / LEASE_FILE).read_text())["owner"] == "7002"


def test_a_lease_whose_heartbeat_is_older_than_the_bound_is_stale(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _lease(tmp_path, "7001", alive=None).acquire()
    later = lease_module._clock.wall() + lease_module.STALE_S + 1
    monkeypatch.setattr(lease_module._clock, "wall", lambda: later)
    _lease(tmp_path, "7002", alive=None, host="n7").acquire()


def test_a_job_whose_lease_was_taken_over_commits_and_deletes_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    old = _lease(tmp_path, "7001", alive=None)
    old.acquire()
    a = _store(tmp_path, keep_last=1, guard=old.guard)
    a.save({"w": torch.zeros(4)}, 1)
    later = lease_module._clock.wall() + lease_module.STALE_S + 1
    monkeypatch.setattr(lease_module._clock, "wall", lambda: later)  # job 7001 stalled past the bound
    new = _lease(tmp_path, "7002", alive=None, host="n8")
    new.acquire()
    b = _store(tmp_path, keep_last=1, guard=new.guard)
    assert b.load_latest() is not None
    b.save({"w": torch.ones(4)}, 5)
    with pytest.raises(CheckpointError, match="now belongs to job 7002"):
        a.save({"w": torch.zeros(4)}, 2)
    _, step, state = _resume(tmp_path)
    assert step == 5 and torch.equal(state["w"], torch.ones(4))


def test_a_symlink_or_damage_in_place_of_the_lease(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / LEASE_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LeaseError, match="is a symlink"):
        _lease(tmp_path, "1").acquire()
    (tmp_path / LEASE_FILE).unlink()
    (tmp_path / LEASE_FILE).write_bytes(b"\x00\xff[1,2")
    _lease(tmp_path, "1").acquire()
    assert "is damaged" in caplog.text


# -- files opened as their owner expects ----------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user (chown)")


def _give_away(path: Path, uid: int = 65534, gid: int = 65534) -> None:
    for entry in [path, *path.rglob("*")]:
        os.chown(entry, uid, gid, follow_symlinks=False)


@needs_root
def test_a_checkpoint_another_user_planted_is_never_unpickled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(4)}, 1)
    planted = tmp_path / "planted"
    _store(planted).save({"w": torch.full((4,), 666.0)}, 9)  # complete, with a valid manifest: XXH3 is no MAC
    os.rename(planted / "step_000000009", tmp_path / "step_000000009")
    _give_away(tmp_path / "step_000000009")
    _, step, state = _resume(tmp_path)
    assert step == 1 and torch.equal(state["w"], torch.zeros(4))
    assert "belongs to" in caplog.text and "uid 65534" in caplog.text and "trusted_group" in caplog.text
    trusting = CheckpointStore(tmp_path, SoloComm(), trusted_gid=65534).load_latest()  # a group the user named
    assert trusting is not None and trusting.step == 9


def test_a_checkpoint_directory_every_user_may_write_to_is_refused_unless_shared_on_purpose(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from slurmrt import UnsafePathError
    from slurmrt.checkpoint.trust import check_directory

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafePathError, match=r"mode 0777.*chmod o-w.*shared_checkpoint_dir=True"):
        check_directory(open_dir, shared=False)
    check_directory(open_dir, shared=True)
    open_dir.chmod(0o1777)
    check_directory(open_dir, shared=False)
    assert "sticky bit" in caplog.text
    open_dir.chmod(0o775)  # a team's directory: group-writable, nobody else
    caplog.clear()
    check_directory(open_dir, shared=False)
    assert not caplog.text


@pytest.mark.parametrize("name", [LEASE_FILE, ".slurmrt-lease.lock", "experiment.json", "events-7001.jsonl"])
def test_a_fifo_or_a_device_link_planted_under_a_file_slurmrt_reads_is_an_error_not_a_hang(
        tmp_path: Path, name: str) -> None:
    from slurmrt import SlurmrtError
    from slurmrt.record.events import read_events
    from slurmrt.record.experiment import establish

    def read() -> None:  # what reads the file: the event log's reader, the experiment, the lease
        if name.startswith("events"):
            list(read_events(tmp_path / name))
        elif name == "experiment.json":
            establish(tmp_path, job="7001", override=None)
        else:
            _lease(tmp_path, "7001").acquire()

    os.mkfifo(tmp_path / name)  # a reader that opened it blocking would wait for a writer for ever
    with pytest.raises((SlurmrtError, OSError), match="not a regular file"):
        read()
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to("/dev/zero")  # read whole, it never ends
    with pytest.raises((SlurmrtError, OSError), match="symlink"):
        read()


def test_a_fifo_in_place_of_a_manifest_or_a_leftover_is_named_not_waited_on(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save({"w": torch.zeros(4)}, 1)
    store.save({"w": torch.ones(4)}, 2)
    os.unlink(tmp_path / "step_000000002" / "manifest.json")
    os.mkfifo(tmp_path / "step_000000002" / "manifest.json")
    os.mkfifo(tmp_path / ".tmp-step_000000003-7001-r0-1")  # a leftover's name: clearing it must not open it
    _, step, _ = _resume(tmp_path)
    assert step == 1
    assert main(["verify", str(tmp_path / "step_000000002")]) == 1


def test_an_oversized_event_line_is_skipped_in_bounded_pieces(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from slurmrt.record import events

    log = tmp_path / "events.jsonl"
    good = '{"time": "2026-01-01T00:00:00+00:00", "event": "init", "job": "1", "restart": 0, "rank": 0}\n'
    log.write_text(good + "x" * (3 * events.MAX_LINE + 5) + "\n" + good)
    assert [e["event"] for e in events.read_events(log)] == ["init", "init"]
    assert "longer than" in caplog.text


def test_the_saves_temporary_directory_has_a_name_nobody_can_plant_beforehand(tmp_path: Path) -> None:
    # Planted under every name a save could pick from the job id, the restart and a counter: none is used.
    for seq in range(1, 4):
        planted = tmp_path / f".tmp-step_000000001-0-{seq}"
        planted.mkdir(parents=True)
        (planted / "rank_00000.pt").symlink_to(tmp_path / "victim")
    (tmp_path / "victim").write_text("precious")
    _store(tmp_path).save({"w": torch.zeros(4)}, 1)
    assert (tmp_path / "victim").read_text() == "precious"


def test_a_local_save_that_fails_leaves_no_temporary_file_in_the_tier(tmp_path: Path) -> None:
    from slurmrt.checkpoint.local import LocalTier

    (tmp_path / "shm").mkdir()
    tier = LocalTier(tmp_path / "shm", tmp_path / "ckpt", node="n1", comm=SoloComm(), per_node=1)
    tier.save({"w": torch.zeros(4)}, 1)
    with pytest.raises(CheckpointError, match="local checkpoint of step 2 failed"):
        tier.save({"w": torch.zeros(4), "f": lambda: None}, 2)  # cannot be pickled: fails mid-write
    left = [p.name for p in (tmp_path / "shm").rglob("*") if p.is_file() and p.name.startswith(".")]
    assert left == []
