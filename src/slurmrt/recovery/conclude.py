"""The end of a run, on every rank: rank 0 has the executor decide and act, and gives its outcome to all.

Every rank is past its saves when :func:`conclude` runs. Rank 0 recovers (:class:`~.executor.Executor`: the plan,
the requeue or the in-job request, the ``exit`` event); the others wait for its outcome in a broadcast. Nobody
leaves before the requeue: Slurm ends every task of the job when it requeues it, and a rank that exited first with a
non-zero code would make ``srun --kill-on-bad-exit`` kill rank 0 before its requeue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .._comm import Comm
from ..stop.decision import Reason, StopDecision
from .executor import Executor
from .plan import Action, Trigger
from .policy import Outcome

logger = logging.getLogger(__name__)

__all__ = ["conclude", "exit_at_init", "trigger_of"]


def trigger_of(stop: StopDecision | None) -> Trigger:
    """The trigger of a run that ended on ``stop`` (None: it ran all its steps)."""
    if stop is None:
        return Trigger.FINISHED
    if Reason.SUSPECT in stop.reasons and not stop.reasons & _ENDS:  # node evidence: as a failed health check
        return Trigger.UNHEALTHY
    return Trigger.STRAGGLER if stop.reasons == {Reason.STRAGGLER} else Trigger.STOPPED


_SUSPECT = "a step computed wrong once, right on its re-run (rt.check: a transient fault, the hardware suspect)"

#: The reasons that decide a stop's end whatever else was agreed with them (a scancel, Ctrl-C, the kill switch).
_ENDS = {Reason.TERM, Reason.INTERRUPT, Reason.KILL_SWITCH}


def conclude(stop: StopDecision | None, *, executor: Executor, comm: Comm, failed_save: bool,
             step: int | None = None, exclude: Sequence[str] = (), progressed: bool = True) -> tuple[Outcome, Action]:
    """How the run ends and what the job does next, the same on every rank; requeues the job when the plan says so.
    Collective. ``step`` is
    the last step the run reached, for the record; ``exclude``: nodes a restart must leave out (a straggler's);
    ``progressed``: the run made at least one step (rank 0's count decides)."""
    comm.all_ok(True)  # every rank is here: rank 0 may requeue
    chosen = None
    if comm.rank == 0:
        trigger = trigger_of(stop)
        detail = _SUSPECT if trigger is Trigger.UNHEALTHY else ""
        done = executor.recover(trigger, nodes=exclude, stop=stop, failed_save=failed_save, step=step,
                                progressed=progressed, detail=detail, about={"planned": True} if stop else None)
        chosen = [done.outcome.name, done.action.value]
    outcome, action = comm.broadcast(chosen)
    return Outcome[outcome], Action(action)


def exit_at_init(switch: Path, executor: Executor, *, lead: bool) -> NoReturn:
    """The kill switch exists when the run starts: exit 0 at once, no requeue (an array drains)."""
    logger.warning("kill switch %s exists: exiting at init with code 0, no requeue", switch)
    stop = StopDecision(-1, frozenset({Reason.KILL_SWITCH}), False)
    if lead:
        executor.recover(Trigger.STOPPED, stop=stop, reason="kill_switch_at_init")
    raise SystemExit(int(Outcome.KILL_SWITCH.code))
