"""A fault whose re-run passes was transient: the node that computed it wrong (one rank's values alone were bad) is
left out through the recovery plan, as a node that failed its health check; a fault that comes back names no node."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurmrt import Outcome, Reason, StopDecision
from slurmrt._errors import TrainingHealthError
from slurmrt.health.check import HealthCheck
from slurmrt.health.record import HealthRecord, read_record
from slurmrt.health.settings import HealthSection
from slurmrt.record.events import EventLog
from slurmrt.recovery.conclude import trigger_of
from slurmrt.recovery.facts import Facts
from slurmrt.recovery.plan import Action, Trigger, plan


def _check(tmp_path: Path, left_out: list[tuple[int, list[str]]]) -> HealthCheck:
    check = HealthCheck(HealthSection(health_certify_after=3), EventLog(tmp_path / "events.jsonl", job=None,
                                                                        restart=0, rank=0),
                        rank=0, world_size=1, directory=tmp_path, node_of={0: "n7"}.get,
                        on_transient=lambda step, nodes: left_out.append((step, nodes)))
    check.loaded(None, lambda read: read())
    return check


def _events(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def test_a_fault_that_passes_on_its_re_run_leaves_the_suspect_node_out_once(tmp_path: Path) -> None:
    left_out: list[tuple[int, list[str]]] = []
    check = _check(tmp_path, left_out)
    for step in range(5):
        check.check(step, loss=1.0)
    with pytest.raises(TrainingHealthError) as caught:
        check.check(5, loss=float("nan"))
    assert caught.value.details["action"] == "rerun"
    assert read_record(tmp_path).suspects == {5: ["n7"]}  # a requeued run hears it too
    for step in (3, 4):  # the re-run, from the checkpoint before the fault: not yet the step
        check.check(step, loss=1.0)
    assert left_out == []
    check.check(5, loss=1.0)
    assert left_out == [(5, ["n7"])] and read_record(tmp_path).suspects == {}
    check.check(6, loss=1.0)
    assert left_out == [(5, ["n7"])], "said once"
    health, transient = [e for e in _events(tmp_path) if e["event"] in ("training_health", "transient_fault")]
    assert health["suspects"] == ["n7"] and (transient["step"], transient["nodes"]) == (5, ["n7"])
    assert transient["left_out"] is False  # the test's on_transient leaves nothing out (it returns None)


def test_a_fault_that_comes_back_names_no_node(tmp_path: Path) -> None:
    left_out: list[tuple[int, list[str]]] = []
    check = _check(tmp_path, left_out)
    check.saved(0)
    for step in range(4):
        check.check(step, loss=1.0)
    for _ in range(2):
        with pytest.raises(TrainingHealthError):
            check.check(5, loss=float("nan"))
    assert check.record.suspects == {}  # reproducible: the data or the model
    for step in range(1, 8):
        check.check(step, loss=1.0)
    assert left_out == []


def test_a_requeued_run_that_passes_the_step_leaves_the_node_out(tmp_path: Path) -> None:
    left_out: list[tuple[int, list[str]]] = []
    first = _check(tmp_path, left_out)
    with pytest.raises(TrainingHealthError):
        first.check(0, loss=float("inf"))
    second = _check(tmp_path, left_out)  # the fault ended the process: the next run re-runs the step
    second.check(0, loss=1.0)
    assert left_out == [(0, ["n7"])]


def test_an_older_record_without_suspects_still_reads(tmp_path: Path) -> None:
    (tmp_path / "health.json").write_text(json.dumps({"certified": 3, "faults": {}, "rewinds": {}, "skips": []}))
    assert read_record(tmp_path) == HealthRecord(certified=3)
    (tmp_path / "health.json").write_text(json.dumps({"certified": 3, "faults": {}, "rewinds": {}, "skips": [],
                                                      "suspects": {"5": ["n1", 7]}}))
    assert read_record(tmp_path) == HealthRecord()  # damaged: read as empty, said


def _stop(*reasons: Reason) -> StopDecision:
    return StopDecision(40, frozenset(reasons), True)


@pytest.mark.parametrize(("reasons", "trigger"), [
    ((Reason.SUSPECT,), Trigger.UNHEALTHY),
    ((Reason.SUSPECT, Reason.SIGNAL), Trigger.UNHEALTHY),  # the warning with it: still node evidence
    ((Reason.SUSPECT, Reason.TERM), Trigger.STOPPED),  # a scancel decides
    ((Reason.SUSPECT, Reason.KILL_SWITCH), Trigger.STOPPED),
])
def test_a_stop_to_leave_a_suspect_out_is_planned_as_node_evidence(reasons: tuple[Reason, ...],
                                                                    trigger: Trigger) -> None:
    assert trigger_of(_stop(*reasons)) is trigger


def test_the_suspect_is_left_out_of_the_requeue_but_a_scancel_agreed_with_it_is_not_requeued() -> None:
    job = Facts(job="7")
    decision = plan(Trigger.UNHEALTHY, job, nodes=["n7"])
    assert (decision.action, decision.outcome, decision.exclude) == (Action.REQUEUE, Outcome.UNHEALTHY, ("n7",))
    scancel = plan(Trigger.STOPPED, job, nodes=["n7"], stop=_stop(Reason.SUSPECT, Reason.TERM))
    assert scancel.action is Action.STOP
    assert plan(Trigger.UNHEALTHY, replace(job, job=None), nodes=["n7"]).action is Action.FAIL


def test_a_census_that_cannot_say_names_no_node_and_the_fault_is_answered_all_the_same(tmp_path: Path) -> None:
    def broken(rank: int) -> str:
        raise RuntimeError("the store does not answer")

    left_out: list[tuple[int, list[str]]] = []
    check = HealthCheck(HealthSection(), EventLog(tmp_path / "events.jsonl", job=None, restart=0, rank=0), rank=0,
                        world_size=1, directory=tmp_path, node_of=broken,
                        on_transient=lambda step, nodes: left_out.append((step, nodes)))
    check.loaded(None, lambda read: read())
    with pytest.raises(TrainingHealthError):
        check.check(2, loss=float("nan"))
    check.check(2, loss=1.0)
    assert check.record.suspects == {} and left_out == []
