"""The one recovery policy: :func:`plan` turns what happened (a :class:`Trigger`) and what is known about the job
(:class:`~slurmrt.recovery.facts.Facts`) into a :class:`Decision`. Pure: no clock, no file, no environment.

Every way a run ends or starts again goes through it: the end of the loop and every agreed stop (``conclude``), a
hang or a lost peer (the hang response), a failed health check, a node that left a ``slurmrt run`` job, a straggler,
and an error that every process lived through (``slurmrt.run_restartable``). The executor
(:mod:`slurmrt.recovery.executor`) carries the decision out.

Three ways back, each with its limit: a restart in the process (``max_in_process_restarts``, a fault the processes
survive), a new step in the job (``slurmrt run --max-in-job-restarts``, a lost process or node, a straggler), and a
requeue (``max_restarts``, anything else that should go on).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..stop.decision import Reason, StopDecision
from .facts import Facts, Raised
from .policy import Outcome, at_time_limit, futile_why

__all__ = ["IN_JOB_LOOP_GUARD", "Action", "Decision", "FaultClass", "NodeEvidence", "Trigger", "classify",
           "fault_outcome", "in_process_refused", "plan"]

#: Two steps in a row that failed without committing a newer checkpoint: the failure follows the job, not a node,
#: and another node would most likely not cure it.
IN_JOB_LOOP_GUARD = 2


class Trigger(enum.Enum):
    """What happened."""

    #: The loop ran all its steps.
    FINISHED = "finished"
    #: An agreed stop: a signal, the deadline, the kill switch, SIGINT (the ``StopDecision`` says which).
    STOPPED = "stopped"
    #: An agreed stop to leave a straggler's node out (``straggler="replace"``).
    STRAGGLER = "straggler"
    #: A peer is gone: a collective failed on a closed connection.
    RANK_LOST = "rank_lost"
    #: The watchdog found a rank making no progress.
    HANG = "hang"
    #: A node left the job (``--no-kill``): Slurm killed the step, nobody in it could ask.
    NODE_GONE = "node_gone"
    #: The start-up health check failed.
    UNHEALTHY = "unhealthy"
    #: A rank ended on an exception of its own.
    SOFTWARE_ERROR = "software_error"
    #: A rank raised under ``slurmrt.run_restartable`` and every process lives: a fault the processes survive.
    RAISED = "raised"


class Action(enum.Enum):
    """What the job does next."""

    IN_PROCESS_RESTART = "in_process_restart"  # the training called again in the same processes (run_restartable)
    IN_JOB_RESTART = "in_job_restart"  # a new step without the bad nodes, in the same job (``slurmrt run``)
    REQUEUE = "requeue"  # ``scontrol requeue``, the bad nodes added to ``ExcNodeList``
    STOP = "stop"  # ends, not requeued, by intent (scancel, SIGINT, the options, max_restarts, the loop guard)
    FINISH = "finish"  # ends for good, as wanted (all steps done, the kill switch)
    FAIL = "fail"  # ends for good on an error, or a fault that may not be retried

    @property
    def for_good(self) -> bool:
        """The job ends here: slurmrt starts no other run of it and asks Slurm for none (Slurm may still requeue a
        preempted job). The one definition: the facade, the guard and :attr:`Decision.restarts` read it."""
        return self not in (Action.IN_PROCESS_RESTART, Action.IN_JOB_RESTART, Action.REQUEUE)

    @classmethod
    def of(cls, value: object) -> Action | None:
        """The action an ``exit`` event names (its ``action``), or None for a value that is none."""
        return next((a for a in cls if a.value == value), None)


#: The triggers whose nodes are only suspects (the census named them from inside the step): under ``slurmrt run``
#: the supervisor judges them from evidence (:func:`classify`) before any node is left out or a spare spent.
_SUSPECTS = {Trigger.RANK_LOST, Trigger.HANG}

#: The triggers that name bad nodes: an in-job restart can cure them.
_NODE_FAULTS = {Trigger.RANK_LOST: Outcome.PEER_LOST, Trigger.HANG: Outcome.HUNG,
                Trigger.NODE_GONE: Outcome.PEER_LOST, Trigger.UNHEALTHY: Outcome.UNHEALTHY}


def fault_outcome(trigger: Trigger) -> Outcome:
    """How a run that ``trigger`` ended is recorded (a node's fault, or a suspect's): its outcome, and so its
    code."""
    return _NODE_FAULTS.get(trigger, Outcome.HUNG)


@dataclass(frozen=True)
class Decision:
    action: Action
    #: How the run ends; its ``code`` is the exit code.
    outcome: Outcome
    #: Why, in words, for the log and the event log.
    why: str
    #: The nodes the restart leaves out (the new step's, or the requeued job's ``ExcNodeList``).
    exclude: tuple[str, ...] = ()
    #: Why an in-job restart was not made where one might have been (recorded as ``in_job_refused``).
    in_job_refused: str | None = None
    #: Why a restart in the process was not made (recorded in the ``in_process`` event; the error then ends the
    #: process, as it would without ``run_restartable``).
    in_process_refused: str | None = None
    #: For an in-job restart: the decision without ``slurmrt run``, carried out when the request cannot be left for
    #: it; for a restart in the process: the decision without it, when a rank does not come back (planned with this
    #: decision, from the same facts: one plan per recovery).
    fallback: Decision | None = None

    @property
    def code(self) -> int:
        return int(self.outcome.code)

    @property
    def restarts(self) -> bool:
        """The job goes on: in this allocation, or after the queue."""
        return not self.action.for_good


def plan(trigger: Trigger, facts: Facts, *, nodes: Sequence[str] = (), stop: StopDecision | None = None,
         failed_save: bool = False, progressed: bool = True, raised: Raised | None = None) -> Decision:
    """The decision for ``trigger``. ``nodes``: the bad nodes (the suspects', the lost or unhealthy node, a
    straggler's, or nodes the options leave out at the next restart); ``stop``: the agreed stop of ``STOPPED`` and
    ``STRAGGLER`` (for ``RAISED``: one agreed before the error, if any); ``failed_save``: the run's last save failed;
    ``progressed``: the run made at least one step; ``raised``: the error of ``RAISED``. An in-job restart and a
    restart in the process carry their :attr:`~Decision.fallback`."""
    if trigger is Trigger.RAISED:
        assert raised is not None, "plan(Trigger.RAISED) weighs the error: raised= names it"
        return _raised(raised, facts, stop)
    decision = _decide(trigger, facts, nodes, stop, failed_save, progressed)
    if decision.action is not Action.IN_JOB_RESTART:
        return decision
    fallback = _decide(trigger, facts.without_in_job(), nodes, stop, failed_save, progressed)
    return dataclasses.replace(decision, fallback=fallback)


#: A rank's own error, not a node's: what ends the process when no restart in the process is made.
_SOFTWARE_ERROR = Decision(Action.FAIL, Outcome.FAILED, "a software error, not a bad node: no exclusion, no requeue")


def _decide(trigger: Trigger, facts: Facts, nodes: Sequence[str], stop: StopDecision | None, failed_save: bool,
            progressed: bool) -> Decision:
    bad = tuple(dict.fromkeys(nodes))
    if trigger is Trigger.SOFTWARE_ERROR:
        return _SOFTWARE_ERROR
    if trigger in _NODE_FAULTS:
        return _node_fault(_NODE_FAULTS[trigger], facts, bad, judged=trigger not in _SUSPECTS)
    if trigger is Trigger.STRAGGLER:
        stop = stop or StopDecision(-1, frozenset({Reason.STRAGGLER}), True)
    if trigger is Trigger.FINISHED or stop is None:
        return _ended(Decision(Action.FINISH, Outcome.FINISHED, "all steps done"), failed_save)
    if stop.reasons == {Reason.DEADLINE} and not progressed:
        return Decision(Action.STOP, Outcome.STOPPED, NO_TIME_TO_TRAIN)
    return _stopped(stop, facts, bad, failed_save)


#: A deadline stop before the run's first step: each requeued run gets the same time limit and would stop the same.
NO_TIME_TO_TRAIN = ("the deadline stopped this run before its first step: the time limit does not hold the margin "
                    "and a save, and a requeued run, with the same limit, would stop the same way (a requeue loop). "
                    "Not requeued. Raise --time, or lower SLURMRT_DEADLINE_MARGIN_S / SLURMRT_SAVE_TIME_S")


def _ended(decision: Decision, failed_save: bool) -> Decision:
    """A run that ends for good without its last checkpoint has failed: its final state is not on disk. (A stop
    that exits non-zero already says something went wrong; a requeued run resumes from the checkpoint before.)"""
    if not failed_save or decision.action is not Action.FINISH:
        return decision
    return Decision(Action.FAIL, Outcome.FAILED, f"{decision.why}, but the last checkpoint failed")


#: The reasons that only ask a restart to leave a node out: a SIGTERM agreed with them is still a scancel's.
_LEAVE_OUT = {Reason.STRAGGLER, Reason.SUSPECT}


def _stopped(stop: StopDecision, facts: Facts, bad: tuple[str, ...], failed_save: bool) -> Decision:
    if Reason.KILL_SWITCH in stop.reasons:
        why = f"kill switch {facts.kill_switch}: stopped, not requeued"
        return _ended(Decision(Action.FINISH, Outcome.KILL_SWITCH, why), failed_save)
    if Reason.INTERRUPT in stop.reasons:
        return Decision(Action.STOP, Outcome.STOPPED, "SIGINT: stopped, not requeued")
    if stop.reasons - _LEAVE_OUT == {Reason.TERM} and not at_time_limit(stop):
        return Decision(Action.STOP, Outcome.STOPPED, "SIGTERM before the time limit (scancel, or preemption, which "
                                                      "Slurm requeues itself): not requeued by slurmrt")
    refused = requeue_refused(facts)
    if refused is not None:
        return Decision(Action.STOP, Outcome.STOPPED, refused)
    reasons = ", ".join(sorted(r.value for r in stop.reasons))
    why = f"stopped at step {stop.step} ({reasons}): requeue"
    if stop.reasons == {Reason.STRAGGLER} and facts.in_job is not None:
        return _straggler_out(stop, facts, bad, why)
    return Decision(Action.REQUEUE, Outcome.REQUEUED, why, bad)


def _straggler_out(stop: StopDecision, facts: Facts, bad: tuple[str, ...], requeue: str) -> Decision:
    """A stop to leave a straggler out, under ``slurmrt run``: a new step without its node, else the requeue."""
    no = in_job_refused(facts, bad)
    if no is not None:
        return Decision(Action.REQUEUE, Outcome.REQUEUED, requeue, bad, in_job_refused=no)
    where = f" without {', '.join(bad)}" if bad else ""
    return Decision(Action.IN_JOB_RESTART, Outcome.REQUEUED, f"stopped at step {stop.step} (straggler): a new "
                    f"step{where}{_weighed(facts)}", bad)


def _weighed(facts: Facts) -> str:
    """In the training, what is left to ``slurmrt run``: its spares, its limit, and so the choice between the new
    step and the requeue."""
    return ", or the requeue, as `slurmrt run` weighs its spares" if facts.in_job and facts.in_job.spares is None \
        else ""


def _node_fault(outcome: Outcome, facts: Facts, bad: tuple[str, ...], *, judged: bool) -> Decision:
    """A hung or lost rank, a lost or unhealthy node: a new step (on the same nodes when none is judged bad, else on
    a spare), else the requeue without the nodes, unless the options or the loop guard say no. Not ``judged``: the
    nodes are suspects, handed to ``slurmrt run`` with the request, which judges them before it spends a spare."""
    no = in_job_refused(facts, bad, judged=judged) if facts.in_job is not None else None
    if facts.in_job is not None and no is None:
        where = f"without {', '.join(bad)}" if judged and bad else \
            f"(suspects {', '.join(bad)}, to be judged)" if bad else "on the same nodes"
        return Decision(Action.IN_JOB_RESTART, outcome, f"a new step {where}{_weighed(facts)}", bad)
    refused = requeue_refused(facts)
    if refused is not None:
        return Decision(Action.FAIL, outcome, f"not requeued: {refused}", bad, in_job_refused=no)
    where = f" without {', '.join(bad)}" if bad else ""
    return Decision(Action.REQUEUE, outcome, f"requeue{where}", bad, in_job_refused=no)


def _raised(raised: Raised, facts: Facts, stop: StopDecision | None) -> Decision:
    """An error every process lived through: the training is called again in the same processes, unless
    :func:`in_process_refused` says why not; then the error ends the process, as it would without the wrapper."""
    no = in_process_refused(raised, facts, stop)
    if no is not None:
        return dataclasses.replace(_SOFTWARE_ERROR, in_process_refused=no)
    done = len(facts.in_process.restarted) if facts.in_process is not None else 0
    return Decision(Action.IN_PROCESS_RESTART, Outcome.FAILED, f"restart {done + 1} in the process",
                    fallback=_SOFTWARE_ERROR)


def in_process_refused(raised: Raised, facts: Facts, stop: StopDecision | None) -> str | None:
    """Why ``raised`` is not restarted in the process (None: it is). The same on every rank, which all weigh the
    same first error and the same earlier ones."""
    limits = facts.in_process
    if limits is None:
        return "not under `slurmrt.run_restartable`"
    if stop is not None:
        return "a stop was already agreed: the run ends as it would have"
    if raised.misconfigured:
        return f"a misconfiguration ({raised.kind}): every generation would meet it; its one line says what to fix"
    if raised.refused is not None:
        return raised.refused
    if not raised.unhealthy and any(r.signature == raised.signature for r in limits.restarted):
        at = f"step {raised.step}" if raised.step is not None else "before the first step"
        return f"the same error ({raised.kind}) at {at} ended an earlier generation: a software error that repeats"
    if len(limits.restarted) >= limits.max_in_process_restarts:
        return f"max_in_process_restarts={limits.max_in_process_restarts} restarts in the process were made"
    return None


def requeue_refused(facts: Facts) -> str | None:
    """Why a run that should be requeued is not (the options, no Slurm, max_restarts, the loop guard); None:
    requeue."""
    policy = facts.policy
    if not policy.requeue:
        return "stopped; requeue is off (requeue=False)"
    if facts.job is None:
        return "stopped; not a SLURM job, nothing to requeue"
    if policy.max_restarts is not None and facts.restart_count >= policy.max_restarts:
        return f"stopped; restart {facts.restart_count} reached max_restarts={policy.max_restarts}"
    if policy.max_futile_runs is not None and facts.futile >= policy.max_futile_runs:
        return futile_why(facts.futile)
    return None


def in_job_refused(facts: Facts, bad: Sequence[str], *, judged: bool = True) -> str | None:
    """Why this step may not be replaced in the job (None: it may). ``bad``: the nodes to leave out, each needing a
    spare; not ``judged``: suspects, which need no spare until ``slurmrt run`` finds node evidence against them (a
    process that died on a healthy node is restarted on the same nodes). The spares and their limit are ``slurmrt
    run``'s alone: in the training (no :class:`~slurmrt.recovery.facts.Spares`) a fault is left for it to weigh."""
    sup = facts.in_job
    if sup is None:
        return "not under `slurmrt run`"
    if judged and not bad:
        return "no node was named, so there is nothing a spare node would change"
    if facts.futile >= IN_JOB_LOOP_GUARD:
        return (f"the last {facts.futile} steps failed without a checkpoint newer than the one they resumed from: the "
                "same failure again, which another node would most likely not cure")
    spares = sup.spares
    if spares is None:
        return None
    if sup.attempt >= spares.max_in_job_restarts:
        return (f"{sup.attempt} in-job restart(s) made, the limit (--max-in-job-restarts) is "
                f"{spares.max_in_job_restarts}")
    if judged and len(spares.nodes) < len(bad):
        return (f"{len(bad)} node(s) to replace ({', '.join(bad)}) but {len(spares.nodes)} spare(s) left"
                + (f" ({', '.join(spares.nodes)})" if spares.nodes else ""))
    return None


class FaultClass(enum.Enum):
    """What a fault was, judged from evidence gathered outside the failed processes (:func:`classify`)."""

    #: A process died or raised; every node named is still in the job and passed its health check.
    PROCESS = "process"
    #: A rank made no progress; its node is in the job and passed its health check.
    HANG = "hang"
    #: Slurm no longer counts the node in the job (``--no-kill``: it failed).
    NODE_LOST = "node_lost"
    #: The node failed the health check run on it from outside (or did not answer it).
    NODE_UNHEALTHY = "node_unhealthy"
    #: The node was the suspect of a hang earlier in this job, and is again.
    NODE_REPEAT = "node_repeat"

    @property
    def of_node(self) -> bool:
        """Node evidence: the node is left out (a spare replaces it) and goes into the bad-node ledger."""
        return self in (FaultClass.NODE_LOST, FaultClass.NODE_UNHEALTHY, FaultClass.NODE_REPEAT)


@dataclass(frozen=True)
class NodeEvidence:
    """What is known of one suspect node after a fault."""

    node: str
    #: Slurm still counts it in the job.
    in_job: bool
    #: What its health check found (``slurmrt run`` runs it with ``srun --overlap``); empty: healthy.
    failures: tuple[str, ...] = ()
    #: Hangs this node was the suspect of earlier in this job.
    hangs_before: int = 0

    def fault(self, trigger: Trigger) -> FaultClass:
        if not self.in_job:
            return FaultClass.NODE_LOST
        if self.failures:
            return FaultClass.NODE_UNHEALTHY
        if trigger is Trigger.HANG:
            return FaultClass.NODE_REPEAT if self.hangs_before else FaultClass.HANG
        return FaultClass.PROCESS

    def to_json(self, trigger: Trigger) -> dict[str, object]:
        return {"node": self.node, "in_job": self.in_job, "failures": list(self.failures),
                "hangs_before": self.hangs_before, "class": self.fault(trigger).value}


#: The classes by weight: the fault is the heaviest of its nodes'.
_WEIGHT = [FaultClass.NODE_LOST, FaultClass.NODE_UNHEALTHY, FaultClass.NODE_REPEAT, FaultClass.HANG,
           FaultClass.PROCESS]


def classify(trigger: Trigger, evidence: Sequence[NodeEvidence]) -> tuple[FaultClass, tuple[str, ...]]:
    """The fault's class and the nodes to leave out: those with node evidence against them (lost, unhealthy, or
    hung twice in this job). A process that died on a healthy node leaves no node out: its step is started again on
    the same nodes, and the spare is kept for a node that really leaves. Pure."""
    classes = [e.fault(trigger) for e in evidence]
    fault = min(classes, key=_WEIGHT.index, default=FaultClass.HANG if trigger is Trigger.HANG else
                FaultClass.PROCESS)
    return fault, tuple(e.node for e, c in zip(evidence, classes, strict=True) if c.of_node)
