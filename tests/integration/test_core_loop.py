"""The core loop with real processes, real signals and gloo: every rank stops at the same step, the checkpoint is
complete or absent, and a resumed run ends where an uninterrupted one would."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from slurmrt.stop.deadline import horizon

from .conftest import expected_weights, read_results
from .launch import start, wait_all

pytestmark = pytest.mark.timeout(240)

N = 4


def _wait_for(path: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"SLURMRT_CHECKPOINT_DIR": str(tmp / "ckpt"), "SLURMRT_SAVE_TIME_S": "1", **extra}


def _committed(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "ckpt").glob("step_*"))


def _events(tmp: Path) -> list[dict[str, object]]:
    path = tmp / "ckpt" / "events-4242.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _calls(tmp: Path) -> list[str]:
    log = tmp / "slurm-calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_signal_to_one_random_rank_stops_every_rank_at_the_same_step_and_resume_continues(workdir: Path) -> None:
    steps = 120
    procs = start(N, workdir, ["--out", str(workdir / "run1"), "--steps", str(steps), "--ready",
                               str(workdir / "ready")], extra=_env(workdir))
    _wait_for(workdir / "ready")
    time.sleep(random.uniform(0.1, 1.0))
    victim = random.randrange(N)
    procs[victim].send_signal(signal.SIGUSR1)
    codes = wait_all(procs, timeout=120)
    results = read_results(workdir / "run1", N)
    stops = {r["stopped_at"] for r in results}
    assert len(stops) == 1 and None not in stops, f"ranks stopped at different steps: {results}"
    (stop,) = stops
    assert all(r["reasons"] == ["signal"] for r in results)
    assert codes == [3] * N  # REQUEUED
    assert _committed(workdir) == [f"step_{stop:09d}"]
    assert "requeue 4242" in _calls(workdir)
    assert [line for line in _calls(workdir) if line.startswith("requeue")] == ["requeue 4242"]

    procs = start(N, workdir, ["--out", str(workdir / "run2"), "--steps", str(steps)],
                  extra=_env(workdir, SLURM_RESTART_COUNT="1"))
    assert wait_all(procs, timeout=120) == [0] * N
    resumed = read_results(workdir / "run2", N)
    assert all(r["start"] == stop + 1 for r in resumed)
    assert all(r["trained"] == list(range(stop + 1, steps)) for r in resumed)
    assert resumed[0]["w"] == pytest.approx(expected_weights(steps, N), abs=1e-5)


def test_kill_switch_created_mid_run_saves_and_exits_zero_without_requeue(workdir: Path) -> None:
    switch = workdir / "STOP"
    procs = start(N, workdir, ["--out", str(workdir / "out"), "--steps", "100000", "--ready", str(workdir / "ready")],
                  extra=_env(workdir, SLURMRT_KILL_SWITCH=str(switch)))
    _wait_for(workdir / "ready")
    time.sleep(0.5)
    switch.touch()
    assert wait_all(procs, timeout=60) == [0] * N
    results = read_results(workdir / "out", N)
    assert len({r["stopped_at"] for r in results}) == 1
    assert all(r["reasons"] == ["kill_switch"] and r["saved"] for r in results)
    assert not [c for c in _calls(workdir) if c.startswith("requeue")]
    # Its own outcome, not FINISHED (the exit code is 0 for both, so that a job array drains as COMPLETED).
    assert [(e["outcome"], e["code"]) for e in _events(workdir) if e["event"] == "exit"] == [("KILL_SWITCH", 0)]


def test_kill_switch_present_at_start_exits_every_rank_at_init_within_seconds(workdir: Path) -> None:
    switch = workdir / "STOP"
    switch.touch()
    procs = start(N, workdir, ["--out", str(workdir / "out"), "--steps", "100000"],
                  extra=_env(workdir, SLURMRT_KILL_SWITCH=str(switch)))
    assert wait_all(procs, timeout=300) == [0] * N
    exits = [e for e in _events(workdir) if e["event"] == "exit"]
    assert [(e.get("reason"), e.get("outcome")) for e in exits] == [("kill_switch_at_init", "KILL_SWITCH")]
    assert not (workdir / "out").exists() or not list((workdir / "out").glob("rank*.json"))
    assert not (workdir / "ckpt").exists() or not _committed(workdir)


def test_deadline_without_any_signal_saves_before_the_end_time_and_requeues(workdir: Path) -> None:
    end = int(time.time()) + 60  # init alone took 23 s once, on 2 cores under load: the end must come well after it
    procs = start(N, workdir, ["--out", str(workdir / "out"), "--steps", "100000", "--step-time", "0.05"],
                  extra=_env(workdir, FAKE_END_TIME=str(end), SLURMRT_DEADLINE_MARGIN_S="4"))
    codes = wait_all(procs, timeout=90)
    results = read_results(workdir / "out", N)
    assert len({r["stopped_at"] for r in results}) == 1
    assert all(r["reasons"] == ["deadline"] and r["saved"] for r in results)
    assert codes == [3] * N
    # When the checkpoint was committed, not when the processes were gone: Slurm's SIGTERM at the end time finds the
    # checkpoint safe, and a loaded machine may take seconds to tear the interpreters down (it once took 23 s to
    # start them), which is no part of the deadline.
    events = _events(workdir)
    (saved,) = [e for e in events if e["event"] == "save" and e["rank"] == 0 and e.get("tier") is None]
    committed = datetime.fromisoformat(str(saved["time"])).timestamp()
    assert committed < end, "the checkpoint must be complete before the job's end time"
    # Not absurdly early: when it decided, the time left was what its own measurements asked for (the steps that may
    # still run, the save and the margin, each as deadline.horizon counts them), not more.
    (decided,) = [e for e in events if e["event"] == "decision" and e["rank"] == 0]
    left = end - datetime.fromisoformat(str(decided["time"])).timestamp()
    needed = horizon(step_s=float(decided["step_s"]), steps_ahead=8, save_s=float(decided["save_s"] or 0), margin_s=4,
                     worst_step_s=decided["worst_step_s"], saves=2)
    assert left <= needed + 5, (left, needed, decided)
    squeues = [c for c in _calls(workdir) if c.startswith("squeue")]
    assert len(squeues) == 1, f"one scheduler query per job, got {squeues}"


def test_sigterm_with_too_little_time_to_save_exits_cleanly_and_keeps_the_previous_checkpoint(workdir: Path) -> None:
    # Saves take 3 s (measured on the periodic saves); Slurm would SIGKILL 2 s after SIGTERM.
    procs = start(N, workdir, ["--out", str(workdir / "out"), "--steps", "100000", "--save-every", "5",
                               "--slow-save", "3"], extra=_env(workdir, SLURMRT_KILL_WAIT_S="2"))
    _wait_for(workdir / "ckpt" / "latest")
    for p in procs:
        p.send_signal(signal.SIGTERM)
    codes = wait_all(procs, timeout=60)
    results = read_results(workdir / "out", N)
    assert codes == [4] * N  # STOPPED: SIGTERM before the time limit is scancel or preemption
    assert all(r["reasons"] == ["sigterm"] and r["saved"] is False for r in results)
    (stop,) = {r["stopped_at"] for r in results}
    committed = _committed(workdir)
    assert committed and all(int(name.split("_")[1]) < stop for name in committed)
    assert any(e["event"] == "save_skipped" for e in _events(workdir))
    assert not [c for c in _calls(workdir) if c.startswith("requeue")]


def test_repeated_sigterm_is_harmless(workdir: Path) -> None:
    procs = start(N, workdir, ["--out", str(workdir / "out"), "--steps", "100000", "--ready", str(workdir / "ready")],
                  extra=_env(workdir))
    _wait_for(workdir / "ready")
    for _ in range(3):
        for p in procs:
            p.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    codes = wait_all(procs, timeout=60)
    results = read_results(workdir / "out", N)
    assert codes == [4] * N
    assert len({r["stopped_at"] for r in results}) == 1
    assert all(r["saved"] for r in results)
    assert len(_committed(workdir)) == 1


def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint_for_resume(workdir: Path) -> None:
    steps = 60
    procs = start(N, workdir, ["--out", str(workdir / "run1"), "--steps", "30"], extra=_env(workdir))
    assert wait_all(procs, timeout=120) == [0] * N
    assert _committed(workdir) == ["step_000000029"]

    procs = start(N, workdir, ["--out", str(workdir / "run2"), "--steps", str(steps), "--slow-save", "30",
                               "--ready", str(workdir / "ready")], extra=_env(workdir))
    _wait_for(workdir / "ready")
    procs[0].send_signal(signal.SIGUSR1)
    tmp_dirs: list[Path] = []
    deadline = time.monotonic() + 60
    while not tmp_dirs and time.monotonic() < deadline:  # the slow save is under way
        tmp_dirs = list((workdir / "ckpt").glob(".tmp-step_*"))
        time.sleep(0.05)
    assert tmp_dirs, "the save never started"
    time.sleep(0.5)
    for p in procs:
        p.kill()
    wait_all(procs, timeout=30)
    assert _committed(workdir) == ["step_000000029"]

    procs = start(N, workdir, ["--out", str(workdir / "run3"), "--steps", str(steps)], extra=_env(workdir))
    assert wait_all(procs, timeout=120) == [0] * N
    resumed = read_results(workdir / "run3", N)
    assert all(r["start"] == 30 for r in resumed)
    assert resumed[0]["w"] == pytest.approx(expected_weights(steps, N), abs=1e-5)
    assert not list((workdir / "ckpt").glob(".tmp-step_*")), "the partial save is cleaned up by the next commit"


def _limit_file_size(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_disk_full_on_one_rank_fails_every_rank_clearly_and_keeps_the_previous_checkpoint(workdir: Path) -> None:
    procs = start(2, workdir, ["--out", str(workdir / "run1"), "--steps", "10"], extra=_env(workdir))
    assert wait_all(procs, timeout=120) == [0, 0]
    before = {p.name: p.stat().st_size for p in (workdir / "ckpt" / "step_000000009").iterdir()}

    # Rank 1 runs under a file-size limit: its write fails with EFBIG, the same path as ENOSPC on a full disk.
    procs = start(2, workdir, ["--out", str(workdir / "run2"), "--steps", "20", "--state-mb", "4"],
                  extra=_env(workdir), preexec={1: lambda: _limit_file_size(2**20)})
    codes = wait_all(procs, timeout=120)
    assert codes == [1, 1], "every rank fails, none hangs in a collective the other never enters"
    for rank in range(2):
        log = (workdir / f"rank{rank}.log").read_text()
        assert "CheckpointError" in log and "previous checkpoint is intact" in log and "rank 1" in log
    assert _committed(workdir) == ["step_000000009"]
    after = {p.name: p.stat().st_size for p in (workdir / "ckpt" / "step_000000009").iterdir()}
    assert after == before
    assert not list((workdir / "ckpt").glob(".tmp-step_*"))
    assert os.path.exists(workdir / "ckpt" / "latest")
