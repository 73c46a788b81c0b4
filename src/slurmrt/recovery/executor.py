"""The one executor of recovery: it asks :func:`~slurmrt.recovery.plan.plan`, carries the decision out and records it.

It is the only writer of the ``exit`` event. The rank (or ``slurmrt run``) that acts for the job calls
:meth:`Executor.recover`; the others only exit with the code it chose.

- Restart in the process (``slurmrt.run_restartable``): every rank asks the same plan of the same first error
  (:meth:`Executor.in_process`); rank 0 records what was made (:meth:`Executor.made_in_process`).
- In-job restart: a rank leaves the request for ``slurmrt run`` (:mod:`.injob`); when that fails, the requeue takes
  over. ``slurmrt run`` itself (``ask=False``) only records it, and starts the step.
- Requeue: the ``exit`` event first (Slurm ends every task once it requeues the job), then ``scontrol requeue``, then
  the bad nodes into ``ExcNodeList`` (:mod:`.exclusion`: Slurm takes it only from a pending job). A process killed
  between the two leaves a requeue chosen and not made: whoever finds the run answered makes it
  (:meth:`Executor.complete_requeue`).
- Stop, finish, fail: the ``exit`` event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .. import _slurm
from ..record.events import Event, EventLog
from ..record.ledger import Ledger
from ..record.runs import Run, runs_of
from ..stop.decision import StopDecision
from . import exclusion, injob
from .facts import Facts, InProcessFacts, Raised
from .plan import Action, Decision, Trigger, plan
from .policy import Outcome, futile_runs, requeue

__all__ = ["Executor"]

logger = logging.getLogger(__name__)

#: The triggers whose failed requeue leaves the batch script to requeue (exit 75); after a fault the exit code
#: stays the fault's.
_STOPS = {Trigger.FINISHED, Trigger.STOPPED, Trigger.STRAGGLER}
#: The triggers whose nodes go into the user's bad-node ledger (:mod:`slurmrt.record.ledger`): node evidence only, a
#: node that was lost or failed its health check (``slurmrt run`` judges a hang's or a lost peer's suspects and
#: passes those it finds bad as these). A suspect named from inside the step (a rank that hung or died) may sit on a
#: healthy node: it stays out of the ledger, as does a straggler, which is slow, not broken.
_BAD_NODE = {Trigger.NODE_GONE, Trigger.UNHEALTHY}


class Executor:
    def __init__(self, facts: Facts, events: EventLog, *, node: str | None,
                 requeue_job: Callable[[str], tuple[bool, str]] = requeue, ledger: Ledger | None = None) -> None:
        """``node``: where the acting process runs (the request names it); ``requeue_job``: ``scontrol requeue``;
        ``ledger``: the user's bad nodes, written when a node is left out for a fault, read at a requeue."""
        self.facts, self.events, self._node = facts, events, node
        self._requeue = requeue_job
        self.ledger = ledger

    def can_leave_out(self, node: str, *, cause: str = "straggler") -> bool:
        """Whether a restart could leave ``node`` out: a spare under ``slurmrt run``, or a requeue. The plan's answer
        for the trigger the stop will be planned as (``cause``: a :class:`Trigger`'s value, a straggler's or a node
        that computed a step wrong, ``"unhealthy"``); nothing is done."""
        return plan(Trigger(cause), self.facts, nodes=[node]).restarts

    def remember(self, nodes: list[str], why: str) -> None:
        """Put ``nodes`` into the user's bad-node ledger without a restart (none could leave them out now)."""
        if self.ledger is not None:
            self.ledger.record(nodes, reason=why, job=self.facts.job)

    def futile(self) -> int:
        """Runs or steps in a row, this one included, that committed no newer checkpoint (the event log)."""
        return futile_runs(runs_of(self.events.path))

    def in_process(self, raised: Raised, limits: InProcessFacts, *, stop: StopDecision | None) -> Decision:
        """Whether the first error of a generation is restarted in the process: the plan for :attr:`Trigger.RAISED`,
        from these facts and ``limits`` (``stop``: a stop agreed before it). Every rank asks it of the same error and
        gets the same answer; nothing is done."""
        return plan(Trigger.RAISED, dataclasses.replace(self.facts, in_process=limits), raised=raised, stop=stop)

    def made_in_process(self, decision: Decision, *, generation: int, rank: int, error: str, step: int | None,
                        fault_time: float, seconds: float, lead: bool) -> None:
        """Record what became of a generation's first error (``rank`` raised ``error`` at ``step``): a restart made
        (every rank back ``seconds`` after this rank caught it at ``fault_time``, by its own clock), or refused
        (:attr:`Decision.in_process_refused` says why). ``lead``: this rank records it (rank 0); the refusal is said
        on every rank, whose error then ends it."""
        made = decision.action is Action.IN_PROCESS_RESTART
        why = decision.in_process_refused
        if lead:
            self.events.emit(Event.IN_PROCESS, generation=generation, action="restart" if made else "refused",
                             first_rank=rank, error=error, step=step, why=why, fault_time=fault_time,
                             seconds=seconds)
        if made and lead:
            logger.info("in-process %s: rank %d raised %s (its last step %s); every rank back %.2f s later",
                        decision.why, rank, error, step, seconds)
        elif not made:  # the first error caught may be a survivor's "connection closed": the why names the cause
            logger.warning("no restart in the process: %s (the first error: rank %d's %s)", why, rank, error)

    def recover(self, trigger: Trigger, *, nodes: Sequence[str] = (), stop: StopDecision | None = None,
                failed_save: bool = False, step: int | None = None, ask: bool = True, detail: str = "",
                progressed: bool = True, about: dict[str, Any] | None = None, **extra: Any) -> Decision:
        """Decide what ``trigger`` means for the job, do it, record it; returns what was done. ``ask``: an in-job
        restart is asked of ``slurmrt run`` with a request file (False: the caller is ``slurmrt run``);
        ``detail``: what failed, in words, for the log and the request; ``progressed``: the run made a step;
        ``about``: more for the request (``since``: when the failure was found, epoch s; ``stacks``: where the
        ranks' stacks are), which ``slurmrt run`` says when it starts the new step."""
        facts = self.facts if trigger is Trigger.FINISHED else self.facts.with_futile(self.futile())  # loop guard
        decision = plan(trigger, facts, nodes=nodes, stop=stop, failed_save=failed_save, progressed=progressed)
        self._remember(trigger, decision, detail)
        reasons = _reasons(trigger, stop, decision)
        if decision.action is Action.IN_JOB_RESTART:
            refused = self._in_job(decision, detail or decision.why, step, reasons, ask,
                                   {"trigger": trigger.value, **(about or {})})
            if refused is None:
                return decision
            assert decision.fallback is not None  # plan() gives every in-job restart its fallback
            decision = dataclasses.replace(decision.fallback, in_job_refused=refused)
        if decision.in_job_refused is not None and facts.in_job is not None:
            logger.error("no in-job restart: %s; falling back to the requeue", decision.in_job_refused)
            self.events.emit(Event.IN_JOB_REFUSED, nodes=list(decision.exclude), why=decision.in_job_refused,
                             lead=True)
        self._exit(decision, step, reasons, **extra)
        if decision.action is Action.REQUEUE:
            return self._requeue_job(decision, stops=trigger in _STOPS)
        return decision

    def _remember(self, trigger: Trigger, decision: Decision, detail: str) -> None:
        """Write the nodes a fault leaves out into the user's bad-node ledger, for the next jobs."""
        if self.ledger is not None and trigger in _BAD_NODE and decision.exclude:
            self.ledger.record(decision.exclude, reason=f"{trigger.value}: {detail or decision.why}",
                               job=self.facts.job)

    def _in_job(self, decision: Decision, why: str, step: int | None, reasons: list[str], ask: bool,
                about: dict[str, Any]) -> str | None:
        """Ask for (or, for ``slurmrt run``, record) a new step without the decision's nodes; why not, or None."""
        sup = self.facts.in_job
        assert sup is not None
        bad = list(decision.exclude)
        if ask:
            no = injob.write_request(sup, {"attempt": sup.attempt, "exclude": bad, "code": decision.code,
                                           "node": self._node, "why": why, **about})
            if no is not None:
                return no
        message = f"in-job restart {sup.attempt + 1}: {decision.why}"
        # The fault was said where it was found (a hang, a lost rank, a straggler); this is its answer, under way.
        spares: dict[str, Any] = {"spares": list(sup.spares.nodes)} if sup.spares is not None else {}  # its own
        logger.info("%s%s", message, f" (spares: {', '.join(spares['spares']) or 'none'})" if spares else "")
        self.events.emit(Event.IN_JOB_RESTART, nodes=bad, why=why, next_attempt=sup.attempt + 1, lead=True, **spares)
        self._exit(decision, step, reasons, why=message)
        return None

    def _exit(self, decision: Decision, step: int | None, reasons: list[str], *, why: str | None = None,
              **extra: Any) -> None:
        outcome, said = decision.outcome, why or decision.why
        if decision.action is Action.IN_JOB_RESTART:  # exit 3, and slurmrt run starts the new step: no requeue
            logger.info("exit %d for %s", outcome.code, said)
        elif decision.action is Action.REQUEUE:  # the recovery under way: its failure, if it fails, says ERROR
            logger.info("exit %d (%s): %s", outcome.code, outcome.name, said)
        elif outcome.code:
            logger.warning("exit %d (%s): %s", outcome.code, outcome.name, said)
        else:
            logger.info("%s: %s", outcome.name.lower(), said)
        self.events.emit(Event.EXIT, code=int(outcome.code), outcome=outcome.name, why=said, reasons=reasons,
                         step=step, lead=True, action=decision.action.value, exclude=list(decision.exclude), **extra)

    def _made_outside(self) -> bool:
        """A step of ``slurmrt run`` with no ``scontrol`` (in a container): the supervisor, outside, makes the
        requeue that the exit event names once the step has ended (:meth:`complete_requeue`)."""
        if self.facts.in_job is None or _slurm.available("scontrol"):
            return False
        logger.info("no scontrol here (a container?): slurmrt run requeues the job once the step has ended")
        return True

    def complete_requeue(self, run: Run | None) -> Decision | None:
        """The requeue that ``run``'s exit event chose and nobody made: the process acting for the run was killed
        between its exit event and ``scontrol requeue``. A rank that finds the run answered, or ``slurmrt run`` once
        the step has ended, makes it here. None: nothing to make (the run chose something else, its requeue was made
        or tried, or Slurm no longer shows the job running: it is being requeued)."""
        chosen = self._unmade_requeue(run)
        if chosen is None:
            return None
        outcome = Outcome[chosen["outcome"]] if chosen.get("outcome") in Outcome.__members__ else Outcome.REQUEUED
        named = chosen.get("exclude")
        exclude = tuple(n for n in named if isinstance(n, str)) if isinstance(named, list) else ()
        logger.warning("rank %s chose the requeue (%s) and did not make it (no scontrol in its step, or killed "
                       "first): requeueing the job now", chosen.get("rank"), chosen.get("why"))
        return self._requeue_job(Decision(Action.REQUEUE, outcome, str(chosen.get("why")), exclude),
                                 stops=outcome is Outcome.REQUEUED)

    def _unmade_requeue(self, run: Run | None) -> dict[str, Any] | None:
        """``run``'s exit event when it chose a requeue that nobody made and Slurm still shows the job running."""
        chosen = run.exit if run is not None else None
        if run is None or chosen is None or chosen.get("action") != Action.REQUEUE.value or run.first(Event.REQUEUE):
            return None
        job = exclusion.read_job(str(self.facts.job))
        return chosen if isinstance(job, str) or job.state in (None, "RUNNING") else None

    def _requeue_job(self, decision: Decision, *, stops: bool) -> Decision:
        job = self.facts.job
        assert job is not None  # plan() requeues only a Slurm job
        if self._made_outside():
            return decision
        prepared = self._exclusions(job, decision)
        done, message = self._requeue(job)
        self.events.emit(Event.REQUEUE, done=done, message=message, restart_count=self.facts.restart_count,
                         lead=True)
        (logger.info if done else logger.error)("%s", message)  # done: the recovery works; not: the user must act
        if done and prepared is not None:
            exclusion.apply_and_record(job, prepared, self.events)
        if done or not stops:
            return decision
        return Decision(decision.action, Outcome.REQUEUE_NEEDED, message, decision.exclude)

    def _exclusions(self, job: str, decision: Decision) -> exclusion.Plan | str | None:
        """The nodes the requeued job leaves out: this run's own first, then the ledger's, within
        ``max_excluded_nodes`` and what the job needs (None: none to leave out)."""
        bad = list(decision.exclude)
        bad += [n for n in (self.ledger.nodes() if self.ledger is not None else []) if n not in bad]
        return exclusion.prepare(job, bad, max_excluded=self.facts.policy.max_excluded_nodes,
                                 needed=self.facts.job_nodes) if bad else None


def _reasons(trigger: Trigger, stop: StopDecision | None, decision: Decision) -> list[str]:
    """The exit event's reasons: the agreed stop's, none for a finished run, else the fault's outcome."""
    if stop is not None:
        return sorted(r.value for r in stop.reasons)
    return [] if trigger is Trigger.FINISHED else [decision.outcome.name.lower()]
