"""The end of a run, on every rank: the verdict, the requeue, and rank 0's outcome given to all.

Every rank is past its saves when :func:`conclude` runs. Rank 0 decides (the exit policy of
:mod:`slurmrt.outcome.policy`, with the requeue-loop guard read from the event log) and requeues; the others wait for
its outcome in a broadcast. Nobody leaves before the requeue: Slurm ends every task of the job when it requeues it,
and a rank that exited first with a non-zero code would make ``srun --kill-on-bad-exit`` kill rank 0 before its
requeue.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .._comm import Comm
from ..launch.topology import Topology
from ..options import Options
from ..record.events import read_events, runs
from ..record.report import Reporter
from ..stop.decision import Reason, StopDecision
from . import exclusion, injob
from .policy import ExitCode, Outcome, Verdict, after_failed_save, choose, futile_runs, requeue

logger = logging.getLogger(__name__)

__all__ = ["conclude", "exit_at_init"]


def _futile(decision: StopDecision | None, events: Path | None, rank: int) -> int:
    """Runs in a row, this one included, that committed no newer checkpoint (rank 0 reads the event log; the
    outcome is rank 0's)."""
    if rank != 0 or events is None or not events.exists() or decision is None:
        return 0
    return futile_runs(runs(read_events(events)))


def conclude(decision: StopDecision | None, *, topology: Topology, options: Options, comm: Comm, report: Reporter,
             events: Path | None, failed_save: bool, step: int | None = None, exclude: Sequence[str] = ()) -> Outcome:
    """How the run ends, the same on every rank; requeues the job when the verdict says so. Collective. ``step`` is
    the last step the run reached, for the record; ``exclude``: nodes a restart must leave out (a straggler's)."""
    verdict = choose(decision, requeue_enabled=options.requeue, is_slurm=topology.is_slurm,
                     restart_count=topology.restart_count, max_restarts=options.max_restarts,
                     kill_switch=options.kill_switch, futile=_futile(decision, events, comm.rank),
                     max_futile=options.max_futile_runs)
    chosen = after_failed_save(verdict.outcome) if failed_save else verdict.outcome
    comm.all_ok(True)  # every rank is here: rank 0 may requeue
    lead = comm.rank == 0
    if lead and verdict.requeue and decision is not None and decision.reasons == {Reason.STRAGGLER} and \
            _in_job(list(exclude), topology, report, verdict.why, step):
        return Outcome[comm.broadcast(chosen.name)]
    report.exit(chosen, verdict, decision, step=step)
    if lead and verdict.requeue and topology.requeue_id:
        done, message = requeue(topology.requeue_id)
        report.requeue(done, message)
        if done and exclude:
            exclusion.exclude_and_record(topology.requeue_id, list(exclude), report.events,
                                         max_excluded=options.max_excluded_nodes)
        chosen = chosen if done else Outcome.REQUEUE_NEEDED
    return Outcome[comm.broadcast(chosen.name)]


def _in_job(bad: list[str], topology: Topology, report: Reporter, why: str, step: int | None) -> bool:
    """Under ``slurmrt run``: ask for a new step without ``bad`` (a straggler's node); False when not supervised,
    or refused (the requeue takes over)."""
    supervised = injob.from_environ(os.environ) if topology.is_slurm and bad else None
    if supervised is None:
        return False
    return injob.request(supervised, report.events, bad, ExitCode.REQUEUED, node=topology.hostname, why=why,
                         step=step, reasons=[Reason.STRAGGLER.value]) is not None


def exit_at_init(switch: Path, report: Reporter) -> NoReturn:
    """The kill switch exists when the run starts: exit 0 at once, no requeue (an array drains)."""
    logger.warning("kill switch %s exists: exiting at init with code 0, no requeue", switch)
    verdict = Verdict(Outcome.KILL_SWITCH, f"kill switch {switch} exists at init")
    report.exit(verdict.outcome, verdict, None, reason="kill_switch_at_init")
    raise SystemExit(int(Outcome.KILL_SWITCH.code))
