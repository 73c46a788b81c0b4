"""The one recovery plan, every trigger against the facts that matter to it; then the executor on top of it, with
Slurm's commands stood in at the process boundary."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurmrt import Outcome, Reason, StopDecision
from slurmrt.record.events import Event, EventLog, read_events
from slurmrt.recovery.executor import Executor
from slurmrt.recovery.facts import Facts, InJob, Spares
from slurmrt.recovery.plan import Action, FaultClass, NodeEvidence, Trigger, classify, plan
from slurmrt.recovery.settings import RecoverySection

RUN_DIR = Path("/run/slurmrt-7")
#: A Slurm job under `slurmrt run` with one spare left, nothing used up.
BASE = Facts(job="7", in_job=InJob(RUN_DIR, 0, Spares(("n3",), 3)))
NO_RUN = replace(BASE, in_job=None)
NO_SPARE = replace(BASE, in_job=InJob(RUN_DIR, 0, Spares((), 3)))
LIMIT = replace(BASE, in_job=InJob(RUN_DIR, 3, Spares(("n3",), 3)))
LOOPING_STEPS = replace(BASE, futile=2)
LOOPING_RUNS = replace(BASE, futile=3)
NO_REQUEUE = replace(NO_SPARE, policy=RecoverySection(requeue=False))
NOT_SLURM = Facts(job=None)
MAX_RESTARTS = replace(NO_SPARE, restart_count=5, policy=RecoverySection(max_restarts=5))

A = Action
#: The faults whose nodes come with evidence (a node that left the job, a failed health check).
NODE_FAULTS = [(Trigger.NODE_GONE, Outcome.PEER_LOST), (Trigger.UNHEALTHY, Outcome.UNHEALTHY)]
#: The faults whose nodes are suspects named from inside the step: judged by `slurmrt run` before a spare is spent.
SUSPECT_FAULTS = [(Trigger.HANG, Outcome.HUNG), (Trigger.RANK_LOST, Outcome.PEER_LOST)]


@pytest.mark.parametrize(("trigger", "outcome"), NODE_FAULTS)
@pytest.mark.parametrize(("facts", "nodes", "action", "refused"), [
    (BASE, ["n2"], A.IN_JOB_RESTART, None),
    (NO_RUN, ["n2"], A.REQUEUE, None),  # no `slurmrt run`: the requeue, as always
    (NO_SPARE, ["n2"], A.REQUEUE, "but 0 spare(s) left"),  # the no-spare node failure: requeued, not dead
    (replace(BASE, in_job=InJob(RUN_DIR, 0, Spares(("n3",), 3))), ["n1", "n2"], A.REQUEUE, "2 node(s) to replace"),
    (LIMIT, ["n2"], A.REQUEUE, "the limit (--max-in-job-restarts) is 3"),
    (BASE, [], A.REQUEUE, "no node was named"),
    (LOOPING_STEPS, ["n2"], A.REQUEUE, "the last 2 steps failed"),
    (LOOPING_RUNS, ["n2"], A.FAIL, "the last 3 steps failed"),  # and the requeue's own guard at 3
    (NO_REQUEUE, ["n2"], A.FAIL, "but 0 spare(s) left"),
    (NOT_SLURM, ["n2"], A.FAIL, None),
    (MAX_RESTARTS, ["n2"], A.FAIL, "but 0 spare(s) left"),
])
def test_a_fault_that_names_nodes_restarts_in_the_job_else_requeues_without_them_else_fails(
        trigger: Trigger, outcome: Outcome, facts: Facts, nodes: list[str], action: Action, refused: str | None
) -> None:
    decision = plan(trigger, facts, nodes=nodes)
    assert decision.action is action, decision
    assert decision.outcome is outcome and decision.code == int(outcome.code)
    assert decision.exclude == tuple(nodes), "the bad nodes are left out of whatever comes next"
    if refused is None:
        assert decision.in_job_refused is None or facts.in_job is None
    else:
        assert decision.in_job_refused is not None and refused in decision.in_job_refused


def _stop(*reasons: Reason, term: float | None = None, end: float | None = None) -> StopDecision:
    return StopDecision(step=40, reasons=frozenset(reasons), save=True, end_time=end, term_time=term)


@pytest.mark.parametrize(("trigger", "stop", "facts", "failed_save", "action", "outcome"), [
    (Trigger.FINISHED, None, BASE, False, A.FINISH, Outcome.FINISHED),
    (Trigger.FINISHED, None, BASE, True, A.FAIL, Outcome.FAILED),
    (Trigger.STOPPED, _stop(Reason.KILL_SWITCH, Reason.SIGNAL), BASE, False, A.FINISH, Outcome.KILL_SWITCH),
    (Trigger.STOPPED, _stop(Reason.KILL_SWITCH), BASE, True, A.FAIL, Outcome.FAILED),
    (Trigger.STOPPED, _stop(Reason.INTERRUPT), BASE, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.TERM, term=100.0, end=1000.0), BASE, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.TERM, term=995.0, end=1000.0), BASE, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.STOPPED, _stop(Reason.SIGNAL), BASE, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.STOPPED, _stop(Reason.SIGNAL), BASE, True, A.REQUEUE, Outcome.REQUEUED),  # resumes from the one before
    (Trigger.STOPPED, _stop(Reason.DEADLINE), BASE, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.STOPPED, _stop(Reason.DEADLINE), NO_REQUEUE, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.DEADLINE), NOT_SLURM, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.DEADLINE), MAX_RESTARTS, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.DEADLINE), LOOPING_RUNS, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.STRAGGLER), BASE, False, A.IN_JOB_RESTART, Outcome.REQUEUED),
    (Trigger.STRAGGLER, None, BASE, False, A.IN_JOB_RESTART, Outcome.REQUEUED),
    (Trigger.STRAGGLER, None, NO_SPARE, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.STRAGGLER, None, NO_RUN, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.STRAGGLER, None, NO_REQUEUE, False, A.STOP, Outcome.STOPPED),
    (Trigger.STOPPED, _stop(Reason.STRAGGLER, Reason.SIGNAL), BASE, False, A.REQUEUE, Outcome.REQUEUED),
    (Trigger.SOFTWARE_ERROR, None, BASE, False, A.FAIL, Outcome.FAILED),
    (Trigger.SOFTWARE_ERROR, None, NO_RUN, False, A.FAIL, Outcome.FAILED),
])
def test_the_end_of_a_run_and_every_agreed_stop(trigger: Trigger, stop: StopDecision | None, facts: Facts,
                                                failed_save: bool, action: Action, outcome: Outcome) -> None:
    decision = plan(trigger, facts, nodes=["n2"] if trigger is not Trigger.FINISHED else [], stop=stop,
                    failed_save=failed_save)
    assert (decision.action, decision.outcome) == (action, outcome), decision.why
    if action is A.REQUEUE:
        assert decision.exclude == ("n2",), "a straggler's node is left out of the requeued job"


def test_a_software_error_is_never_a_bad_node() -> None:
    decision = plan(Trigger.SOFTWARE_ERROR, BASE, nodes=["n2"])
    assert decision.exclude == () and not decision.restarts and "software error" in decision.why


@pytest.mark.parametrize(("trigger", "outcome"), SUSPECT_FAULTS)
@pytest.mark.parametrize(("facts", "nodes", "action", "refused"), [
    (BASE, ["n2"], A.IN_JOB_RESTART, None),
    (NO_SPARE, ["n2"], A.IN_JOB_RESTART, None),  # no spare needed until evidence says the node is bad
    (BASE, ["n1", "n2"], A.IN_JOB_RESTART, None),
    (BASE, [], A.IN_JOB_RESTART, None),  # nobody named: the same nodes
    (NO_REQUEUE, ["n2"], A.IN_JOB_RESTART, None),  # a new step is no requeue
    (NO_RUN, ["n2"], A.REQUEUE, None),  # no `slurmrt run`: the requeue, as always
    (LIMIT, ["n2"], A.REQUEUE, "the limit (--max-in-job-restarts) is 3"),
    (LOOPING_STEPS, ["n2"], A.REQUEUE, "the last 2 steps failed"),
    (LOOPING_RUNS, ["n2"], A.FAIL, "the last 3 steps failed"),
    (NOT_SLURM, ["n2"], A.FAIL, None),
])
def test_a_hang_or_lost_peer_under_slurmrt_run_hands_its_suspects_over_to_be_judged(
        trigger: Trigger, outcome: Outcome, facts: Facts, nodes: list[str], action: Action, refused: str | None
) -> None:
    """A suspect is not a bad node: the step's ranks hand it to `slurmrt run` (which checks it from outside) without
    a spare for it; only the bounds (--max-in-job-restarts, the loop guard) refuse the new step."""
    decision = plan(trigger, facts, nodes=nodes)
    assert decision.action is action, decision
    assert decision.outcome is outcome and decision.exclude == tuple(nodes)
    if refused is None:
        assert decision.in_job_refused is None or facts.in_job is None
    else:
        assert decision.in_job_refused is not None and refused in decision.in_job_refused


def _seen(node: str, *, in_job: bool = True, failures: tuple[str, ...] = (), hangs: int = 0) -> NodeEvidence:
    return NodeEvidence(node, in_job, failures, hangs)


@pytest.mark.parametrize(("trigger", "evidence", "fault", "bad"), [
    (Trigger.RANK_LOST, [_seen("n2")], FaultClass.PROCESS, ()),  # a process died on a healthy node
    (Trigger.RANK_LOST, [_seen("n2"), _seen("n1")], FaultClass.PROCESS, ()),
    (Trigger.HANG, [_seen("n2")], FaultClass.HANG, ()),
    (Trigger.HANG, [_seen("n2", hangs=1)], FaultClass.NODE_REPEAT, ("n2",)),  # hung twice on n2 in this job
    (Trigger.RANK_LOST, [_seen("n2", hangs=1)], FaultClass.PROCESS, ()),  # a kill is not a hang
    (Trigger.RANK_LOST, [_seen("n2", in_job=False)], FaultClass.NODE_LOST, ("n2",)),
    (Trigger.NODE_GONE, [_seen("n2", in_job=False), _seen("n1")], FaultClass.NODE_LOST, ("n2",)),
    (Trigger.HANG, [_seen("n1"), _seen("n2", failures=("/dev/shm is not writable",))], FaultClass.NODE_UNHEALTHY,
     ("n2",)),
    (Trigger.RANK_LOST, [], FaultClass.PROCESS, ()),
])
def test_a_fault_is_classified_from_its_evidence_and_only_node_evidence_leaves_a_node_out(
        trigger: Trigger, evidence: list[NodeEvidence], fault: FaultClass, bad: tuple[str, ...]) -> None:
    assert classify(trigger, evidence) == (fault, bad)


def test_the_words_say_which_rule_refused() -> None:
    assert "max_restarts=5" in plan(Trigger.STOPPED, MAX_RESTARTS, stop=_stop(Reason.SIGNAL)).why
    assert "requeue loop" in plan(Trigger.STOPPED, LOOPING_RUNS, stop=_stop(Reason.SIGNAL)).why
    assert "requeue=False" in plan(Trigger.NODE_GONE, NO_REQUEUE, nodes=["n2"]).why
    assert plan(Trigger.NODE_GONE, NO_SPARE, nodes=["n2"]).why == "requeue without n2"


# -- the executor: Slurm's requeue and exclusion stood in, the event log real ---------------------------------------

@pytest.fixture(autouse=True)
def _no_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exclusion reads and updates the job with scontrol: stood in, so no test asks the machine's own Slurm."""
    monkeypatch.setattr("slurmrt.recovery.exclusion.prepare",
                        lambda job, bad, *, max_excluded, needed=None: "no scontrol here")
    monkeypatch.setattr("slurmrt.recovery.exclusion.apply_and_record", lambda job, prepared, events: None)
    monkeypatch.setattr("slurmrt.recovery.exclusion.read_job", lambda job: "no scontrol here")


def _executor(tmp_path: Path, facts: Facts, requeued: list[str], *, works: bool = True) -> Executor:
    events = EventLog(tmp_path / "events.jsonl", job="7", restart=0, rank=-1)

    def requeue(job: str) -> tuple[bool, str]:
        requeued.append(job)
        return works, f"requeued {job}" if works else "scontrol: not found"

    return Executor(facts, events, node=None, requeue_job=requeue)


def test_a_node_lost_with_no_spare_left_is_recorded_once_and_requeued(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    excluded: list[list[str]] = []
    monkeypatch.setattr("slurmrt.recovery.exclusion.prepare", lambda job, bad, *, max_excluded, needed=None: bad)
    monkeypatch.setattr("slurmrt.recovery.exclusion.apply_and_record",
                        lambda job, prepared, events: excluded.append(prepared))
    requeued: list[str] = []
    done = _executor(tmp_path, NO_SPARE, requeued).recover(Trigger.NODE_GONE, nodes=["n2"], ask=False, step=12)
    assert done.action is Action.REQUEUE and requeued == ["7"] and excluded == [["n2"]]
    ev = list(read_events(tmp_path / "events.jsonl"))
    assert [e["event"] for e in ev] == ["in_job_refused", "exit", "requeue"]
    assert ev[1]["code"] == 5 and ev[1]["outcome"] == "PEER_LOST" and ev[1]["step"] == 12 and ev[1]["lead"] is True


def test_the_supervisor_records_an_in_job_restart_it_makes_itself(tmp_path: Path) -> None:
    requeued: list[str] = []
    done = _executor(tmp_path, BASE, requeued).recover(Trigger.NODE_GONE, nodes=["n2"], ask=False,
                                                       detail="n2 left the job (node failure)")
    assert done.action is Action.IN_JOB_RESTART and not requeued
    assert not RUN_DIR.exists() or not list(RUN_DIR.glob("request-*")), "slurmrt run asks nobody"
    ev = list(read_events(tmp_path / "events.jsonl"))
    assert [e["event"] for e in ev] == ["in_job_restart", "exit"]
    assert ev[0]["why"] == "n2 left the job (node failure)" and ev[0]["next_attempt"] == 1


def test_a_request_that_cannot_be_left_falls_back_to_the_requeue(tmp_path: Path) -> None:
    """The supervisor's directory is open to everyone (planted?): the rank cannot ask, so it requeues."""
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    facts = replace(BASE, in_job=InJob(tmp_path / "open", 0, Spares(("n3",), 3)))
    requeued: list[str] = []
    done = _executor(tmp_path, facts, requeued).recover(Trigger.HANG, nodes=["n2"])
    assert done.action is Action.REQUEUE and requeued == ["7"]
    (refused,) = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == Event.IN_JOB_REFUSED.value]
    assert "cannot leave the request" in refused["why"]


def test_a_failed_requeue_after_a_stop_leaves_it_to_the_batch_script(tmp_path: Path) -> None:
    requeued: list[str] = []
    executor = _executor(tmp_path, NO_RUN, requeued, works=False)
    assert executor.recover(Trigger.STOPPED, stop=_stop(Reason.SIGNAL)).outcome is Outcome.REQUEUE_NEEDED
    assert executor.recover(Trigger.HANG, nodes=["n2"]).outcome is Outcome.HUNG  # a fault keeps its code


def test_the_loop_guard_reads_the_event_log_only_when_a_restart_is_at_stake(tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl", job="7", restart=0, rank=0)
    for restart in range(3):  # three runs that resumed from step 29 and saved nothing newer
        EventLog(events.path, job="7", restart=restart, rank=0).emit(Event.RESUME, step=29)
    requeued: list[str] = []
    executor = Executor(NO_RUN, events, node="n1", requeue_job=lambda job: (requeued.append(job) or True, "ok"))
    assert executor.futile() == 3
    assert executor.recover(Trigger.STOPPED, stop=_stop(Reason.DEADLINE)).action is Action.STOP and not requeued
    assert executor.recover(Trigger.FINISHED).action is Action.FINISH


def test_a_deadline_stop_before_the_first_step_is_not_requeued_with_or_without_an_event_log() -> None:
    # Each requeued run gets the same time limit: one too short for the margin and a save stops every run at its
    # first step. Without a checkpoint directory (no event log) the futile-run guard cannot count them.
    first = plan(Trigger.STOPPED, NO_RUN, stop=_stop(Reason.DEADLINE), progressed=False)
    assert (first.action, first.outcome) == (A.STOP, Outcome.STOPPED)
    assert "before its first step" in first.why and "--time" in first.why and "SLURMRT_DEADLINE_MARGIN_S" in first.why
    later = plan(Trigger.STOPPED, NO_RUN, stop=_stop(Reason.DEADLINE), progressed=True)
    assert later.action is A.REQUEUE  # a run that trained: the next one resumes from its checkpoint
    signalled = plan(Trigger.STOPPED, NO_RUN, stop=_stop(Reason.DEADLINE, Reason.SIGNAL), progressed=False)
    assert signalled.action is A.REQUEUE  # a warning signal: the cluster wants the job gone, not the limit


def test_a_requeue_chosen_and_not_made_is_made_once_by_whoever_finds_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit event comes before `scontrol requeue`: a process killed between the two leaves a requeue chosen
    and not made, which another rank or `slurmrt run` makes (chaos campaign, seed 308, trial 7)."""
    from slurmrt.record.runs import runs_of
    from slurmrt.recovery import exclusion

    def killed(job: str) -> tuple[bool, str]:
        raise KeyboardInterrupt("SIGKILL between the exit event and scontrol requeue")

    chooser = Executor(NO_RUN, EventLog(tmp_path / "events.jsonl", job="7", restart=0, rank=0), node="n1",
                       requeue_job=killed)
    with pytest.raises(KeyboardInterrupt):
        chooser.recover(Trigger.HANG, nodes=["n2"], step=40)
    requeued: list[str] = []
    finder = _executor(tmp_path, NO_RUN, requeued)
    (run,) = runs_of(tmp_path / "events.jsonl")
    monkeypatch.setattr(exclusion, "read_job", lambda job: exclusion.JobNodes((), 3, None, state="REQUEUED"))
    assert finder.complete_requeue(run) is None and not requeued  # Slurm shows it requeued: it was made
    monkeypatch.setattr(exclusion, "read_job", lambda job: exclusion.JobNodes((), 3, None, state="RUNNING"))
    made = finder.complete_requeue(run)
    assert made is not None and made.outcome is Outcome.HUNG and made.exclude == ("n2",) and requeued == ["7"]
    (run,) = runs_of(tmp_path / "events.jsonl")
    assert finder.complete_requeue(run) is None and requeued == ["7"]  # made once
    stopped = tmp_path / "stopped.jsonl"  # a run that chose to stop has no requeue to make
    Executor(replace(NO_RUN, policy=RecoverySection(requeue=False)), EventLog(stopped, job="7", restart=0, rank=0),
             node="n1",
             requeue_job=killed).recover(Trigger.STOPPED, stop=_stop(Reason.SIGNAL))
    (run,) = runs_of(stopped)
    assert finder.complete_requeue(run) is None and requeued == ["7"]
