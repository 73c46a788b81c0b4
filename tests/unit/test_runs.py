"""The event log read back as runs (slurmrt.record.runs): one way to find a run's step, and one way to find how slurmrt
ended it, used by the hang response, slurmrt run, the guard job and the executor alike."""

from __future__ import annotations

from pathlib import Path

from slurmrt.record.events import Event, EventLog
from slurmrt.record.runs import run_of, runs_of


def test_a_runs_step_and_its_exit_event_are_found_one_way(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for restart, attempt, ends in ((0, 0, False), (0, 1, True), (1, 0, False)):
        log = EventLog(path, job="9", restart=restart, rank=0, attempt=attempt)
        log.emit(Event.INIT)
        if ends:
            log.emit(Event.EXIT, code=3, outcome="REQUEUED", lead=True)
    step = run_of(path, 0, 1)
    assert step is not None and (step.restart, step.attempt) == (0, 1) and step.exit is not None
    assert step.exit["code"] == 3 and step.exit is step.first(Event.EXIT)
    first = run_of(path, 0, 0)
    assert first is not None and first.exit is None  # killed before it said how it ended
    assert run_of(path, 2, 0) is None and run_of(None, 0, 0) is None
    assert [r.label for r in runs_of(path)] == ["0", "0.1", "1"]
