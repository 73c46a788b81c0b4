"""The Runtime in one process, with the clock and the scheduler faked at the process boundary."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import slurmrt
from slurmrt import ExitCode, Reason, _clock
from slurmrt.stop.decision import reason_for
from tests.unit.conftest import fake_slurm


class FakeClock:
    def __init__(self) -> None:
        self.wall_s = time.time()
        self.mono_s = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_clock, "wall", lambda: fake.wall_s)
    monkeypatch.setattr(_clock, "mono", lambda: fake.mono_s)
    return fake


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """A failing test must not leave its Runtime's handlers to the next one."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A batch-shell job (one process) with Slurm's commands stood in (tests/unit/conftest.py); returns the call
    log."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{fake_slurm(monkeypatch, tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURMRT_END_TIME_REFRESH_S", "1e9")
    return log


def _signal_self(rt: slurmrt.Runtime, sig: signal.Signals) -> None:
    """Send ``sig`` to this process and wait until slurmrt recorded it. A warning signal reaches the process through
    the thread that keeps it open (the main thread blocks it for its children), then the recorder runs in the main
    thread: a moment after os.kill returns, not before."""
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 20
    while reason_for(sig) not in rt.local_reasons():
        assert time.monotonic() < deadline, f"{sig.name} was never recorded"
        time.sleep(0.001)


def _wait_for_end_time(rt: slurmrt.Runtime) -> None:
    deadline = time.monotonic() + 20
    while rt.end_time is None:
        assert time.monotonic() < deadline, "the watcher never got the end time from squeue"
        time.sleep(0.01)


def _wait_for_line(path: Path, text: str) -> None:
    deadline = time.monotonic() + 20
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.01)


def test_deadline_stops_at_the_last_step_whose_save_still_fits(clock: FakeClock, job: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    end = int(clock.wall_s) + 1000
    monkeypatch.setenv("FAKE_END_TIME", str(end))
    rt = slurmrt.init(checkpoint_dir=tmp_path / "ckpt", save_time_s=30, deadline_margin_s=30)
    _wait_for_end_time(rt)
    assert rt.end_time == end
    stopped = None
    for step in range(1000):
        clock.advance(10.0)  # a 10 s step
        if rt.should_stop(step):
            stopped = step
            break
    # Stop when now + 1 step (10 s) + save (30 s, budgeted at 37.5 s) + margin (30 s) reaches the end: the step
    # ending at end - 77.5.
    assert stopped is not None and clock.wall_s >= end - 77.5 > clock.wall_s - 10
    assert rt.stop_reason is Reason.DEADLINE
    assert rt.save({"step": stopped}, step=stopped)
    assert rt.finish() is ExitCode.REQUEUED
    calls = job.read_text().splitlines()
    assert calls == ["squeue -h -j 99 -o %S %e", "requeue 99"]


def test_no_end_time_means_no_deadline(clock: FakeClock, job: Path) -> None:
    rt = slurmrt.init()  # squeue answers N/A: an unlimited job
    _wait_for_line(job, "squeue")
    for step in range(100):
        clock.advance(3600)
        assert not rt.should_stop(step)
    assert rt.finish() is ExitCode.FINISHED


def test_sigterm_at_the_time_limit_requeues(clock: FakeClock, job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(clock.wall_s) + 5))
    rt = slurmrt.init(deadline=False)
    clock.advance(10)
    os.kill(os.getpid(), signal.SIGTERM)
    assert rt.should_stop(0) and rt.stop_reason is Reason.TERM
    assert rt.finish() is ExitCode.REQUEUED
    assert "requeue 99" in job.read_text()


def test_sigterm_before_the_time_limit_is_scancel_and_is_not_requeued(clock: FakeClock, job: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(clock.wall_s) + 3600))
    rt = slurmrt.init()
    os.kill(os.getpid(), signal.SIGTERM)
    assert rt.should_stop(0)
    assert rt.finish() is ExitCode.STOPPED
    assert "requeue" not in (job.read_text() if job.exists() else "")


def test_max_restarts_stops_the_requeue_loop(clock: FakeClock, job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    rt = slurmrt.init(max_restarts=3, deadline=False)
    _signal_self(rt, signal.SIGUSR1)
    assert rt.should_stop(0)
    assert rt.finish() is ExitCode.STOPPED


def test_a_refused_requeue_exits_with_requeue_needed(clock: FakeClock, job: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_REQUEUE_FAIL", "1")
    rt = slurmrt.init(deadline=False)
    _signal_self(rt, signal.SIGUSR1)
    assert rt.should_stop(0)
    assert rt.finish() is ExitCode.REQUEUE_NEEDED


def test_without_scontrol_the_exit_code_asks_the_batch_script_to_requeue(clock: FakeClock, job: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    rt = slurmrt.init(deadline=False)
    _signal_self(rt, signal.SIGUSR2)
    assert rt.should_stop(0)
    assert rt.finish() == 75


def test_kill_switch_polled_in_the_background_stops_with_exit_zero(clock: FakeClock, job: Path,
                                                                   tmp_path: Path) -> None:
    switch = tmp_path / "STOP"
    rt = slurmrt.init(kill_switch=switch, watch_interval_s=0.01, deadline=False)
    assert not rt.should_stop(0)
    switch.touch()
    deadline = time.monotonic() + 10
    step = 1
    while not rt.should_stop(step):
        assert time.monotonic() < deadline
        step += 1
        time.sleep(0.01)
    assert rt.stop_reason is Reason.KILL_SWITCH
    assert rt.finish() == 0
    assert rt.outcome is slurmrt.Outcome.KILL_SWITCH
    assert "requeue" not in (job.read_text() if job.exists() else "")


def test_kill_switch_present_at_init_exits_zero(job: Path, tmp_path: Path) -> None:
    switch = tmp_path / "STOP"
    switch.touch()
    with pytest.raises(SystemExit) as info:
        slurmrt.init(kill_switch=switch)
    assert info.value.code == 0


def test_signal_handlers_are_restored_after_finish(job: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGUSR1, mine)
    rt = slurmrt.init(deadline=False)
    assert signal.getsignal(signal.SIGUSR1) is not mine
    rt.finish()
    assert signal.getsignal(signal.SIGUSR1) is mine


def test_after_finish_a_late_warning_signal_is_ignored_not_deadly(job: Path) -> None:
    """A USR1 whose default (to die) slurmrt found is ignored once it is done: a warning that comes while a finished
    task tears down must not fail it. SIGTERM keeps its default: the job's end still ends the process."""
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rt = slurmrt.init(deadline=False)
    rt.finish()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_save_without_a_checkpoint_dir_says_how_to_fix_it(job: Path) -> None:
    rt = slurmrt.init(deadline=False)
    with pytest.raises(slurmrt.ConfigError, match="checkpoint_dir"):
        rt.save({}, step=0)
    rt.close()


def test_the_experiment_id_is_stored_with_the_checkpoints_and_kept_by_the_next_run(job: Path, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    ckpt = tmp_path / "ckpt"
    rt = slurmrt.init(checkpoint_dir=ckpt, deadline=False)
    first = rt.experiment_id
    assert first.startswith("99-") and json.loads((ckpt / "experiment.json").read_text())["id"] == first
    assert rt.load_latest() is None and rt.loaded and rt.resumed_step is None
    rt.save({"x": 1}, step=4)
    rt.close()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued run
    rt = slurmrt.init(checkpoint_dir=ckpt, deadline=False)
    assert rt.experiment_id == first and not rt.loaded
    assert rt.load_latest() is not None and rt.resumed_step == 4
    rt.close()
    inits = [e for e in map(json.loads, (ckpt / "events-99.jsonl").read_text().splitlines()) if e["event"] == "init"]
    assert [e["experiment"] for e in inits] == [first, first]
    rt = slurmrt.init(checkpoint_dir=tmp_path / "other", deadline=False)
    assert rt.experiment_id != first, "a fresh checkpoint directory is a new experiment"
    rt.close()


def test_rank_zero_records_its_progress_every_progress_s(clock: FakeClock, job: Path, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    rt = slurmrt.init(event_log=log, deadline=False, progress_s=10)
    for step in range(25):
        rt.should_stop(step)
        clock.advance(1.0)
    rt.close()
    progress = [e["step"] for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "progress"]
    assert progress == [0, 10, 20]


def test_several_processes_without_torch_distributed_is_a_clear_error_not_a_run_per_rank() -> None:
    from slurmrt._comm import open_groups

    with pytest.raises(slurmrt.ConfigError, match=r"2 processes but torch.distributed is not initialized"):
        open_groups(2)
    assert open_groups(1).control is None


def test_time_outside_the_steps_is_left_out_of_the_step_time(clock: FakeClock, job: Path) -> None:
    rt = slurmrt.init(deadline=False)
    for step in range(5):
        rt.should_stop(step)
        clock.advance(1.0)
    clock.advance(600.0)  # an evaluation
    rt.restart_step_clock()
    rt.should_stop(5)
    assert rt.stop.budget.steps.estimate() == pytest.approx(1.0)
    rt.close()


def test_the_end_time_is_asked_even_without_the_deadline_so_a_time_limit_sigterm_requeues(
        clock: FakeClock, job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    monkeypatch.setenv("FAKE_END_TIME", str(int(clock.wall_s) + 5))
    rt = slurmrt.init(deadline=False)
    _wait_for_end_time(rt)
    clock.advance(10)
    os.kill(os.getpid(), signal.SIGTERM)
    assert rt.should_stop(0) and rt.stop_reason is Reason.TERM
    assert rt.finish() is ExitCode.REQUEUED, "a SIGTERM at the end time is the time limit, not a scancel"
    assert "requeue 99" in job.read_text()


def test_a_requeued_run_starts_from_the_step_and_save_times_the_earlier_runs_measured(job: Path,
                                                                                     tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    lines = [{"event": "init", "rank": 0}, {"event": "progress", "rank": 0, "step": 0, "step_s": 0.5},
             {"event": "save", "rank": 0, "step": 9, "seconds": 2.0},
             {"event": "save", "rank": 1, "step": 9, "seconds": 99.0},  # rank 0 speaks for the job
             {"event": "save", "rank": 0, "step": 19, "seconds": 3.5}, {"event": "save", "rank": 0, "seconds": 1.0},
             {"event": "decision", "rank": 0, "step": 20, "step_s": 0.25}]
    (ckpt / "events-99.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"event": "sa')
    rt = slurmrt.init(checkpoint_dir=ckpt, deadline=False, save_time_s=30)
    assert rt.stop.budget.saves.estimate() == 3.5 and rt.stop.budget.steps.estimate() == 0.25
    rt.close()
    rt = slurmrt.init(checkpoint_dir=tmp_path / "fresh", deadline=False, save_time_s=30)
    assert rt.stop.budget.saves.estimate() == 30 and rt.stop.budget.steps.estimate() is None
    rt.close()


def test_the_measured_times_come_from_the_tail_of_a_long_event_log(tmp_path: Path) -> None:
    from slurmrt.record.runs import measured

    log = tmp_path / "events.jsonl"
    early = [{"event": "save", "rank": 0, "seconds": 50.0}] * 50  # outside the tail: not read
    late = [{"event": "progress", "rank": 0, "step_s": 0.5}, {"event": "save", "rank": 0, "seconds": 2.0}]
    text = "".join(json.dumps(e) + "\n" for e in early + late)
    log.write_text(text)
    tail = len("".join(json.dumps(e) + "\n" for e in late)) + 5  # the tail starts inside an early line
    assert measured(log, tail_bytes=tail) == (0.5, 2.0)
    short = "".join(json.dumps(e) + "\n" for e in early[:1] + late)
    log.write_text(short)
    assert measured(log, tail_bytes=len(short)) == (0.5, 50.0), "the whole file, first line included"


def test_a_phase_that_no_longer_fits_before_the_end_is_not_entered(clock: FakeClock, job: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(clock.wall_s) + 4 * 3600))
    rt = slurmrt.init(checkpoint_dir=tmp_path / "ckpt", save_time_s=10, deadline_margin_s=30)
    for step in range(10):
        clock.advance(1)
        assert not rt.should_stop(step, before="eval" if step == 5 else None), "a phase never measured: no budget"
        if step == 5:
            with rt.phase("eval"):
                clock.advance(1200)  # a 20-minute evaluation
    clock.advance(4 * 3600 - 1200 - 10 - 1000)  # 1000 s left: the steps fit, the evaluation does not
    rt.restart_step_clock()  # that jump was not a step
    assert not rt.should_stop(10)
    assert rt.should_stop(11, before="eval") and rt.stop_reason is Reason.DEADLINE
    assert rt.stop_decision is not None and rt.stop_decision.step == 11
    events = [json.loads(line) for line in (tmp_path / "ckpt" / "events-99.jsonl").read_text().splitlines()]
    assert [e["seconds"] for e in events if e["event"] == "phase"] == [1200.0]
    assert rt.finish() is ExitCode.REQUEUED


def test_the_requeue_loop_guard_stops_after_three_runs_without_a_newer_checkpoint(
        clock: FakeClock, job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "ckpt" / "events-99.jsonl"
    log.parent.mkdir()
    earlier = [(0, "fresh_start", None), (0, "save", 10), (1, "resume", 10), (2, "resume", 10), (2, "save", 10)]
    log.write_text("".join(json.dumps({"time": "2026-11-22T10:00:00+00:00", "event": e, "job": "99",
                                       "restart": r, "rank": 0, "step": s}) + "\n" for r, e, s in earlier))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    rt = slurmrt.init(checkpoint_dir=tmp_path / "ckpt", deadline=False)
    _signal_self(rt, signal.SIGUSR1)
    assert rt.should_stop(0)
    assert rt.finish() is ExitCode.STOPPED, "runs 1, 2 and 3 committed nothing newer than step 10"
    (exit_event,) = [json.loads(line) for line in log.read_text().splitlines() if '"exit"' in line]
    assert "requeue loop" in exit_event["why"] and "requeue" not in (job.read_text() if job.exists() else "")


def test_two_futile_runs_still_requeue(clock: FakeClock, job: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "ckpt" / "events-99.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"time": "2026-11-22T10:00:00+00:00", "event": "resume", "job": "99", "restart": 1,
                               "rank": 0, "step": 10}) + "\n")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    rt = slurmrt.init(checkpoint_dir=tmp_path / "ckpt", deadline=False)
    _signal_self(rt, signal.SIGUSR1)
    assert rt.should_stop(0)
    assert rt.finish() is ExitCode.REQUEUED


def test_a_fault_after_an_in_process_restart_is_placed_in_its_own_generation(job: Path) -> None:
    """The step a generation's fault is recorded at is one that generation reported: after a restart, none until
    its first step, never the step an earlier generation reached (which would make a new fault "the same error at
    the same step" and refuse it). The run's last step stays, for its exit."""
    rt = slurmrt.init(deadline=False)
    rt.should_stop(23)
    assert rt.stop.generation_step == rt.stop.last_step == 23
    rt.stop.restart()
    assert rt.stop.generation_step is None and rt.stop.last_step == 23
    rt.should_stop(24)
    assert rt.stop.generation_step == 24
    rt.finish()


def test_sigterm_is_told_apart_from_a_warning_signal(job: Path) -> None:
    """A rank waiting to rejoin an in-process restart gives up at SIGTERM (srun ending the step: KillWait left),
    not at a warning, which a restarted generation can still stop for with a save."""
    rt = slurmrt.init(deadline=False)
    _signal_self(rt, signal.SIGUSR1)
    assert not rt.stop.terminated
    _signal_self(rt, signal.SIGTERM)
    assert rt.stop.terminated
    rt.finish()


def test_sigterm_after_srun_saw_a_peer_end_is_said_at_info_naming_it(
        job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Under `slurmrt run`, a task killed makes srun take the step down: SIGTERM to the survivors, whose recovery
    then works (the benchmark's every crash showed it). That SIGTERM is said at INFO with the task srun saw end,
    not as a stop's WARNING; the warning signal before it stays a WARNING."""
    from slurmrt._safefs import private_dir
    from slurmrt.recovery import injob
    from slurmrt.recovery.facts import ATTEMPT_ENV, DIR_ENV

    run_dir = private_dir(tmp_path / "run")
    for key, value in {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                       "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1",
                       "SLURMD_NODENAME": "n1", DIR_ENV: str(run_dir), ATTEMPT_ENV: "0"}.items():
        monkeypatch.setenv(key, value)
    log = tmp_path / "events.jsonl"
    rt = slurmrt.init(deadline=False, event_log=log)
    with caplog.at_level("INFO", logger="slurmrt.runtime.report"):
        rt.should_stop(0)
        _signal_self(rt, signal.SIGUSR1)
        rt.should_stop(1)
        injob.write_ended(run_dir, 0, {1: ("n2", "Killed")})  # slurmrt run's record of srun's line
        _signal_self(rt, signal.SIGTERM)
        rt.should_stop(2)
    said = {r.message.split(":")[0]: r for r in caplog.records if "received" in r.message}
    assert said["rank 0 received SIGUSR1"].levelname == "WARNING"
    term = said["rank 0 received SIGTERM"]
    assert term.levelname == "INFO" and "srun takes the step down after it saw rank 1 (Killed, on n2) end" in \
        term.message, term.message
    rt.finish()
    said_in_log = {e["signal"]: e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "signal"}
    assert said_in_log["SIGTERM"]["after"] == "rank 1 (Killed, on n2)" and "after" not in said_in_log["SIGUSR1"]


def test_a_signal_that_wakes_a_rank_stalled_past_its_allowance_is_said_at_info(
        job: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A frozen rank (the hang rehearsal's SIGSTOP, a process stuck in the kernel) wakes only when Slurm takes its
    step down: SIGCONT, then SIGTERM. That SIGTERM is the hang's answer at work, in a recovery that worked: INFO.
    A signal that reaches a rank in step is a stop's news: WARNING."""
    monkeypatch.setenv("SLURMRT_WATCH_INTERVAL_S", "1e9")  # the watcher polls once, at the start: the test drives
    monkeypatch.setenv("SLURMRT_HANG_FLOOR_S", "5")
    rt = slurmrt.init(deadline=False)
    with caplog.at_level("INFO", logger="slurmrt.runtime.report"):
        for step in range(10):
            clock.advance(0.1)
            rt.should_stop(step)
        _signal_self(rt, signal.SIGUSR1)
        clock.advance(0.1)
        rt.should_stop(10)
        warned = [r for r in caplog.records if "received SIGUSR1" in r.message]
        assert [r.levelname for r in warned] == ["WARNING"], warned
        caplog.clear()
        clock.advance(60)  # frozen: no step boundary for 60 s, past the allowance (the floor, 5 s)
        _signal_self(rt, signal.SIGTERM)
        rt.should_stop(11)
    said = [r for r in caplog.records if "received SIGTERM" in r.message]
    assert [r.levelname for r in said] == ["INFO"] and "stalled past the watchdog's allowance" in said[0].message
    assert not [r for r in caplog.records if r.levelno >= 30 and "received" in r.message], caplog.records
    assert not [r for r in caplog.records if "received SIGUSR1" in r.message], "each signal is said once"
    rt.finish()
