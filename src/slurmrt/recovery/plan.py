"""The one recovery policy: :func:`plan` turns what happened (a :class:`Trigger`) and what is known about the job
(:class:`~slurmrt.recovery.facts.Facts`) into a :class:`Decision`. Pure: no clock, no file, no environment.

Every way a run ends goes through it: the end of the loop and every agreed stop (``conclude``), a hang or a lost peer
(the hang response), a failed health check, a node that left a ``slurmrt run`` job, a straggler. The executor
(:mod:`slurmrt.recovery.executor`) carries the decision out.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..stop.decision import Reason, StopDecision
from .facts import Facts
from .policy import Outcome, at_time_limit, futile_why

__all__ = ["IN_JOB_LOOP_GUARD", "Action", "Decision", "Trigger", "plan"]

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


class Action(enum.Enum):
    """What the job does next."""

    IN_JOB_RESTART = "in_job_restart"  # a new step without the bad nodes, in the same job (``slurmrt run``)
    REQUEUE = "requeue"  # ``scontrol requeue``, the bad nodes added to ``ExcNodeList``
    STOP = "stop"  # ends, not requeued, by intent (scancel, SIGINT, the options, max_restarts, the loop guard)
    FINISH = "finish"  # ends for good, as wanted (all steps done, the kill switch)
    FAIL = "fail"  # ends for good on an error, or a fault that may not be retried


#: The triggers that name bad nodes: an in-job restart can cure them.
_NODE_FAULTS = {Trigger.RANK_LOST: Outcome.HUNG, Trigger.HANG: Outcome.HUNG, Trigger.NODE_GONE: Outcome.HUNG,
                Trigger.UNHEALTHY: Outcome.UNHEALTHY}


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

    @property
    def code(self) -> int:
        return int(self.outcome.code)

    @property
    def restarts(self) -> bool:
        """The job goes on: in this allocation, or after the queue."""
        return self.action in (Action.IN_JOB_RESTART, Action.REQUEUE)


def plan(trigger: Trigger, facts: Facts, *, nodes: Sequence[str] = (), stop: StopDecision | None = None,
         failed_save: bool = False, progressed: bool = True) -> Decision:
    """The decision for ``trigger``. ``nodes``: the bad nodes (the suspects', the lost or unhealthy node, a
    straggler's, or nodes the options leave out at the next restart); ``stop``: the agreed stop of ``STOPPED`` and
    ``STRAGGLER``; ``failed_save``: the run's last save failed; ``progressed``: the run made at least one step."""
    bad = tuple(dict.fromkeys(nodes))
    if trigger is Trigger.SOFTWARE_ERROR:
        return Decision(Action.FAIL, Outcome.FAILED, "a software error, not a bad node: no exclusion, no requeue")
    if trigger in _NODE_FAULTS:
        return _node_fault(_NODE_FAULTS[trigger], facts, bad)
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


def _stopped(stop: StopDecision, facts: Facts, bad: tuple[str, ...], failed_save: bool) -> Decision:
    if Reason.KILL_SWITCH in stop.reasons:
        why = f"kill switch {facts.kill_switch}: stopped, not requeued"
        return _ended(Decision(Action.FINISH, Outcome.KILL_SWITCH, why), failed_save)
    if Reason.INTERRUPT in stop.reasons:
        return Decision(Action.STOP, Outcome.STOPPED, "SIGINT: stopped, not requeued")
    if stop.reasons == {Reason.TERM} and not at_time_limit(stop):
        return Decision(Action.STOP, Outcome.STOPPED, "SIGTERM before the time limit (scancel, or preemption, which "
                                                      "Slurm requeues itself): not requeued by slurmrt")
    refused = requeue_refused(facts)
    if refused is not None:
        return Decision(Action.STOP, Outcome.STOPPED, refused)
    reasons = ", ".join(sorted(r.value for r in stop.reasons))
    why = f"stopped at step {stop.step} ({reasons}): requeue"
    if stop.reasons == {Reason.STRAGGLER} and facts.in_job is not None:
        no = in_job_refused(facts, bad)
        if no is None:
            return Decision(Action.IN_JOB_RESTART, Outcome.REQUEUED, why, bad)
        return Decision(Action.REQUEUE, Outcome.REQUEUED, why, bad, in_job_refused=no)
    return Decision(Action.REQUEUE, Outcome.REQUEUED, why, bad)


def _node_fault(outcome: Outcome, facts: Facts, bad: tuple[str, ...]) -> Decision:
    """A hung or lost rank, a lost or unhealthy node: a new step on a spare, else the requeue without the nodes,
    unless the options or the loop guard say no."""
    no = in_job_refused(facts, bad) if facts.in_job is not None else None
    if facts.in_job is not None and no is None:
        return Decision(Action.IN_JOB_RESTART, outcome, f"a new step without {', '.join(bad)}", bad)
    refused = requeue_refused(facts)
    if refused is not None:
        return Decision(Action.FAIL, outcome, f"not requeued: {refused}", bad, in_job_refused=no)
    where = f" without {', '.join(bad)}" if bad else ""
    return Decision(Action.REQUEUE, outcome, f"requeue{where}", bad, in_job_refused=no)


def requeue_refused(facts: Facts) -> str | None:
    """Why a run that should be requeued is not (the options, no Slurm, max_restarts, the loop guard); None:
    requeue."""
    if not facts.requeue:
        return "stopped; requeue is off (requeue=False)"
    if facts.job is None:
        return "stopped; not a SLURM job, nothing to requeue"
    if facts.max_restarts is not None and facts.restart_count >= facts.max_restarts:
        return f"stopped; restart {facts.restart_count} reached max_restarts={facts.max_restarts}"
    if facts.max_futile_runs is not None and facts.futile >= facts.max_futile_runs:
        return futile_why(facts.futile)
    return None


def in_job_refused(facts: Facts, bad: Sequence[str]) -> str | None:
    """Why this step may not be replaced in the job (None: it may)."""
    sup = facts.in_job
    if sup is None:
        return "not under `slurmrt run`"
    if not bad:
        return "no node was named, so there is nothing a spare node would change"
    if sup.attempt >= sup.max_restarts:
        return f"{sup.attempt} in-job restart(s) made, the limit (--max-in-job-restarts) is {sup.max_restarts}"
    if len(sup.spares) < len(bad):
        return (f"{len(bad)} node(s) to replace ({', '.join(bad)}) but {len(sup.spares)} spare(s) left"
                + (f" ({', '.join(sup.spares)})" if sup.spares else ""))
    if facts.futile >= IN_JOB_LOOP_GUARD:
        return (f"the last {facts.futile} steps failed without a checkpoint newer than the one they resumed from: the "
                "same failure again, which another node would most likely not cure")
    return None
