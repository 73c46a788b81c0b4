"""The end of a run, on every rank: the verdict, the requeue, and rank 0's outcome given to all.

Every rank is past its saves when :func:`conclude` runs. Rank 0 decides (the exit policy of
:mod:`slurmrt.outcome.policy`, with the requeue-loop guard read from the event log) and requeues; the others wait for
its outcome in a broadcast. Nobody leaves before the requeue: Slurm ends every task of the job when it requeues it,
and a rank that exited first with a non-zero code would make ``srun --kill-on-bad-exit`` kill rank 0 before its
requeue.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

from .._comm import Comm
from ..launch.topology import Topology
from ..options import Options
from ..record.events import read_events, runs
from ..record.report import Reporter
from ..stop.decision import StopDecision
from .policy import Outcome, Verdict, after_failed_save, choose, futile_runs, requeue

logger = logging.getLogger(__name__)

__all__ = ["conclude", "exit_at_init"]


def _futile(decision: StopDecision | None, events: Path | None, rank: int) -> int:
    """Runs in a row, this one included, that committed no newer checkpoint (rank 0 reads the event log; the
    outcome is rank 0's)."""
    if rank != 0 or events is None or not events.exists() or decision is None:
        return 0
    return futile_runs(runs(read_events(events)))


def conclude(decision: StopDecision | None, *, topology: Topology, options: Options, comm: Comm, report: Reporter,
             events: Path | None, failed_save: bool, step: int | None = None) -> Outcome:
    """How the run ends, the same on every rank; requeues the job when the verdict says so. Collective. ``step`` is
    the last step the run reached, for the record."""
    verdict = choose(decision, requeue_enabled=options.requeue, is_slurm=topology.is_slurm,
                     restart_count=topology.restart_count, max_restarts=options.max_restarts,
                     kill_switch=options.kill_switch, futile=_futile(decision, events, comm.rank),
                     max_futile=options.max_futile_runs)
    chosen = after_failed_save(verdict.outcome) if failed_save else verdict.outcome
    report.exit(chosen, verdict, decision, step=step)
    comm.all_ok(True)  # every rank is here: rank 0 may requeue
    if comm.rank == 0 and verdict.requeue and topology.requeue_id:
        done, message = requeue(topology.requeue_id)
        report.requeue(done, message)
        chosen = chosen if done else Outcome.REQUEUE_NEEDED
    return Outcome[comm.broadcast(chosen.name)]


def exit_at_init(switch: Path, report: Reporter) -> NoReturn:
    """The kill switch exists when the run starts: exit 0 at once, no requeue (an array drains)."""
    logger.warning("kill switch %s exists: exiting at init with code 0, no requeue", switch)
    verdict = Verdict(Outcome.KILL_SWITCH, f"kill switch {switch} exists at init")
    report.exit(verdict.outcome, verdict, None, reason="kill_switch_at_init")
    raise SystemExit(int(Outcome.KILL_SWITCH.code))
