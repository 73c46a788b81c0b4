from __future__ import annotations

import time

import pytest

from slurmrt import _clock
from slurmrt.stop.deadline import (
    Budget,
    DurationEstimator,
    EndTime,
    end_time_from_env,
    parse_squeue_time,
    query_job_times,
    time_is_short,
)


def test_estimator_skips_the_slow_first_steps_and_takes_a_high_quantile() -> None:
    est = DurationEstimator(window=100, skip=2, quantile=0.95)
    est.add(30.0)  # compilation
    est.add(10.0)  # warm-up
    for i in range(100):
        est.add(1.0 + (0.5 if i % 10 == 0 else 0.0))  # jitter: every tenth step is slow
    assert est.estimate() == pytest.approx(1.5)


def test_estimator_follows_a_drifting_step_time() -> None:
    est = DurationEstimator(window=8, quantile=0.95)
    for _ in range(8):
        est.add(1.0)
    for _ in range(8):
        est.add(2.0)
    assert est.estimate() == 2.0


def test_estimator_gives_the_default_until_it_has_a_measurement() -> None:
    est = DurationEstimator(default=30.0)
    assert est.estimate() == 30.0
    est.add(2.0)
    assert est.estimate() == 2.0


@pytest.mark.parametrize(("now", "short"), [(900.0, False), (935.0, False), (936.0, True), (2000.0, True)])
def test_time_is_short_when_steps_save_and_margin_no_longer_fit(now: float, short: bool) -> None:
    # 3 steps of 3 s + a 20 s save budgeted at 25 s + a 30 s margin = 64 s before the end at 1000.
    assert time_is_short(now=now, end=1000.0, step_s=3.0, steps_ahead=3, save_s=20.0, margin_s=30.0) is short


def test_time_is_short_reserves_room_for_one_step_as_slow_as_the_slowest_seen() -> None:
    common = {"end": 1000.0, "step_s": 3.0, "steps_ahead": 3, "save_s": 20.0, "margin_s": 30.0}
    assert not time_is_short(now=900.0, **common)
    assert time_is_short(now=900.0, worst_step_s=40.0, **common)  # 37 s more for one 40 s step


def test_estimator_remembers_the_slowest_step_beyond_its_window() -> None:
    est = DurationEstimator(window=4)
    for seconds in (1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0):
        est.add(seconds)
    assert est.estimate() == 1.0 and est.peak == 9.0


def test_no_end_time_means_no_deadline() -> None:
    assert not time_is_short(now=1e12, end=None, step_s=1.0, steps_ahead=2, save_s=1.0, margin_s=1.0)


def test_squeue_end_time_is_local_time_and_unlimited_jobs_have_none() -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_800_000_000))
    assert parse_squeue_time(stamp + "\n") == 1_800_000_000
    assert parse_squeue_time("N/A\n") is None
    assert parse_squeue_time("Unknown") is None
    assert parse_squeue_time("") is None


def test_slurm_job_end_time_is_used_when_slurm_sets_it() -> None:
    assert end_time_from_env({"SLURM_JOB_END_TIME": "1800000000"}) == 1_800_000_000
    assert end_time_from_env({}) is None


def test_budget_holds_two_saves_when_a_periodic_save_falls_due_before_the_stop() -> None:
    budget = Budget(margin_s=30.0, save_time_s=20.0, kill_wait_s=30.0)
    for _ in range(5):  # 2 skipped as warm-up, then 3 steps of 3 s
        budget.step_done(3.0)
    # One save: 3 steps x 3 s + 25 s (a 20 s save budgeted at 1.25x) + 30 s margin = 64 s before the end at 1000.
    assert not budget.deadline_near(now=935.0, end=1000.0, steps_ahead=3)
    assert budget.deadline_near(now=936.0, end=1000.0, steps_ahead=3)
    # The loop saves every 100 s on its own, the last at 850: the next is due within the horizon, so two saves.
    budget.save_done(20.0, started=750.0, periodic=True)
    budget.save_done(20.0, started=850.0, periodic=True)
    assert budget.deadline_near(now=911.0, end=1000.0, steps_ahead=3)  # 9 + 2 x 25 + 30 = 89 s
    assert not budget.deadline_near(now=910.0, end=1000.0, steps_ahead=3)


def test_budget_says_whether_a_save_still_fits_between_sigterm_and_sigkill() -> None:
    budget = Budget(margin_s=30.0, save_time_s=10.0, kill_wait_s=30.0)
    # SIGTERM at 100, SIGKILL at 130; no step measured: 30 s left - 1 s spare >= a 10 s save.
    assert budget.save_fits_after_term(now=119.0, term_time=100.0, steps_ahead=2)
    assert not budget.save_fits_after_term(now=120.0, term_time=100.0, steps_ahead=2)
    for _ in range(3):
        budget.step_done(4.0)  # the third counts: 2 steps ahead now cost 8 s
    assert not budget.save_fits_after_term(now=112.0, term_time=100.0, steps_ahead=2)
    assert budget.save_fits_after_term(now=111.0, term_time=100.0, steps_ahead=2)


def test_end_time_from_slurm_wins_and_the_scheduler_is_asked_once_per_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(_clock, "mono", lambda: now[0])
    asked: list[str] = []

    def fetch(job: str) -> tuple[float, float]:
        asked.append(job)
        return 4000.0 + len(asked), 5000.0 + len(asked)

    assert not EndTime({"SLURM_JOB_END_TIME": "4000"}, job_id="7", ask=True, refresh_s=60, fetch=fetch).asks
    end = EndTime({}, job_id="7", ask=True, refresh_s=60, fetch=fetch)
    assert end.value is None
    end.poll()
    now[0] = 59.0
    end.poll()
    assert (asked, end.value) == (["7"], 5001.0)
    now[0] = 60.0
    end.poll()  # `scontrol update TimeLimit=...` moved the end: the refresh picks it up
    assert (asked, end.value) == (["7", "7"], 5002.0)
    assert end.started == 4001.0  # the run's start, from the first answer: a start does not move
    assert EndTime({"SLURM_JOB_START_TIME": "3000", "SLURM_JOB_END_TIME": "4000"}, job_id="7", ask=True,
                   refresh_s=60, fetch=fetch).started == 3000.0
    assert not EndTime({}, job_id="7", ask=False, refresh_s=60, fetch=fetch).asks  # not the asking rank


def test_one_squeue_call_gives_the_runs_start_and_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from slurmrt.stop import deadline

    said: list[str] = []
    asked: list[tuple[str, ...]] = []

    def run(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str] | str:
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, said[0], "") if said else "squeue: not found"

    monkeypatch.setattr(deadline._slurm, "run", run)
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_800_000_000))
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_800_003_600))
    assert query_job_times("7") == (None, None)  # no squeue: nothing known, a warning
    said.append(f"{start} {end}\n")
    assert query_job_times("7") == (1_800_000_000, 1_800_003_600)
    assert asked[-1] == ("squeue", "-h", "-j", "7", "-o", "%S %e")
    said[0] = f"{start} N/A\n"
    assert query_job_times("7") == (1_800_000_000, None)  # an unlimited job: a start, no deadline
    for garbage in ("", "N/A\n", f"{start} {end} extra\n"):
        said[0] = garbage
        assert query_job_times("7") == (None, None)
