"""The fault campaign's count of what its faults met (benchmarks/chaos_moments.py): each fault's phase, and faults
the job answered as one counted as one moment."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from benchmarks import chaos_moments as cm

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)


def ev(t: float, event: str, **kw: Any) -> dict[str, Any]:
    return {"time": (T0 + timedelta(seconds=t)).isoformat(), "event": event, "rank": 0, **kw}


# a run: init at 0, training from 5, a save written from 18 to 20, a stop decided at 40, its exit at 42; the next run
# starts at 60 and resumes at 65
EVENTS = [ev(0, "init"), ev(5, "fresh_start"), ev(10, "progress", step=100), ev(20, "save", step=150, seconds=2.0),
          ev(30, "progress", step=300), ev(40, "decision", step=400), ev(42, "exit", outcome="REQUEUED"),
          ev(60, "init"), ev(65, "resume", step=150)]


def at(t: float) -> float:
    return (T0 + timedelta(seconds=t)).timestamp()


def test_each_fault_gets_the_phase_the_job_was_in() -> None:
    said = {t: cm.phase(at(t), EVENTS, None) for t in (-1, 2, 12, 19, 25, 41, 50, 62, 70)}
    assert said == {-1: "start-up", 2: "start-up", 12: "training", 19: "saving", 25: "training", 41: "stopping",
                    50: "stopping", 62: "start-up", 70: "training"}


def test_faults_before_the_job_started_again_are_one_moment() -> None:
    # 12 s: training; 13 s: before any new start, the same moment; 70 s: after the resume at 65 s, a new one
    phases, moments = cm.met([(at(12), "rank-crash"), (at(13), "node-loss"), (at(70), "hang")], EVENTS)
    assert moments == 2 and phases == {"training": 2, "recovering": 1}
    assert cm.met([], EVENTS) == ({}, 0)


def test_the_simulators_list_of_faults_is_read_back() -> None:
    stamp = datetime.fromtimestamp(at(12)).isoformat(timespec="milliseconds")
    output = (f"faults (trace t.csv): 2 injected (1 rank-crash, 1 hang)\n  {stamp} rank-crash: task 1\n"
              f"  {stamp} hang: task 0\ngoodput: 50.0% of 10 s\n")
    assert cm.injected_at(output) == [(at(12), "hang"), (at(12), "rank-crash")]
