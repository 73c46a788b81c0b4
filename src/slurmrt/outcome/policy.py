"""How a run ends: its :class:`Outcome`, the exit code that tells ``sacct`` why, and whether slurmrt requeues the job.

The policy is one pure function, :func:`choose`, of the agreed stop decision and a few facts about the job; rank 0
applies it for every rank. :func:`requeue` is the one side effect, ``scontrol requeue``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from .. import _slurm
from ..record.events import Event, Run
from ..stop.decision import Reason, StopDecision

__all__ = ["ExitCode", "Outcome", "Verdict", "choose", "futile_runs", "requeue"]

#: Stop requeueing after this many runs in a row committed no newer checkpoint (``max_futile_runs``).
MAX_FUTILE_RUNS = 3

#: A SIGTERM within this many seconds of the end time (or after it) is the time limit, not scancel/preemption.
TIME_LIMIT_TOLERANCE_S = 15.0


class ExitCode(enum.IntEnum):
    """Exit codes of :meth:`slurmrt.Runtime.exit` (and values of :meth:`~slurmrt.Runtime.finish`)."""

    #: All steps done, or stopped by the kill switch: the tasks of a job array drain as COMPLETED, not FAILED.
    FINISHED = 0
    #: An error, or a run that ended for good without its last checkpoint.
    FAILED = 1
    #: Stopped after a checkpoint, and the job was requeued (by slurmrt, or Slurm requeues it: preemption).
    REQUEUED = 3
    #: Stopped, and not to be requeued: scancel, SIGINT, SIGTERM before the time limit, max restarts reached.
    STOPPED = 4
    #: A rank hung or a peer was lost: the stacks are in the log and the event log, the suspect nodes are excluded
    #: from the requeued job. ``srun --kill-on-bad-exit=1`` ends the step on it.
    HUNG = 5
    #: The node failed slurmrt's start-up health check (``health_check=True``): excluded, and the job requeued.
    UNHEALTHY = 6
    #: Stopped for a requeue that slurmrt could not make (no scontrol in a container, requeue refused): a batch
    #: script may run `scontrol requeue` itself when it sees this code (EX_TEMPFAIL: "try again later").
    REQUEUE_NEEDED = 75


class Outcome(enum.Enum):
    """How the run ended; each outcome has one exit code, and the event log records the outcome's name."""

    FINISHED = ExitCode.FINISHED, "all steps done"
    KILL_SWITCH = ExitCode.FINISHED, "the kill switch stopped it; not requeued"
    REQUEUED = ExitCode.REQUEUED, "stopped for a requeue"
    STOPPED = ExitCode.STOPPED, "stopped; not requeued"
    REQUEUE_NEEDED = ExitCode.REQUEUE_NEEDED, "stopped for a requeue that slurmrt could not make"
    FAILED = ExitCode.FAILED, "ended for good, but its last checkpoint failed"
    HUNG = ExitCode.HUNG, "a rank hung or a peer was lost"
    UNHEALTHY = ExitCode.UNHEALTHY, "a node failed the start-up health check"

    def __init__(self, code: ExitCode, meaning: str) -> None:
        self.code = code
        self.meaning = meaning


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    #: Why, in words, for the log and the event log.
    why: str

    @property
    def requeue(self) -> bool:
        """slurmrt must requeue the job itself (``scontrol requeue``)."""
        return self.outcome is Outcome.REQUEUED


def choose(decision: StopDecision | None, *, requeue_enabled: bool, is_slurm: bool, restart_count: int,
           max_restarts: int | None, kill_switch: Path | None = None, futile: int = 0,
           max_futile: int | None = MAX_FUTILE_RUNS) -> Verdict:
    """The outcome of a run that stopped for ``decision`` (None: it ran all its steps), before any save failure.
    ``futile``: how many runs in a row, this one included, committed no newer checkpoint (:func:`futile_runs`)."""
    if decision is None:
        return Verdict(Outcome.FINISHED, "all steps done")
    if Reason.KILL_SWITCH in decision.reasons:
        return Verdict(Outcome.KILL_SWITCH, f"kill switch {kill_switch}: stopped, not requeued")
    if Reason.INTERRUPT in decision.reasons:
        return Verdict(Outcome.STOPPED, "SIGINT: stopped, not requeued")
    if decision.reasons == {Reason.TERM} and not at_time_limit(decision):
        return Verdict(Outcome.STOPPED, "SIGTERM before the time limit (scancel, or preemption, which Slurm requeues "
                                        "itself): not requeued by slurmrt")
    refused = requeue_refused(requeue_enabled=requeue_enabled, is_slurm=is_slurm, restart_count=restart_count,
                              max_restarts=max_restarts, futile=futile, max_futile=max_futile)
    if refused is not None:
        return Verdict(Outcome.STOPPED, refused)
    reasons = ", ".join(sorted(r.value for r in decision.reasons))
    return Verdict(Outcome.REQUEUED, f"stopped at step {decision.step} ({reasons}): requeue")


def requeue_refused(*, requeue_enabled: bool, is_slurm: bool, restart_count: int, max_restarts: int | None,
                    futile: int, max_futile: int | None) -> str | None:
    """Why a run that should be requeued is not (the options, no Slurm, max_restarts, the loop guard); None: requeue.
    The one policy for every requeue slurmrt makes: a stop (:func:`choose`), a hang, a failed health check."""
    if not requeue_enabled:
        return "stopped; requeue is off (requeue=False)"
    if not is_slurm:
        return "stopped; not a SLURM job, nothing to requeue"
    if max_restarts is not None and restart_count >= max_restarts:
        return f"stopped; restart {restart_count} reached max_restarts={max_restarts}"
    if max_futile is not None and futile >= max_futile:
        return futile_why(futile)
    return None


def futile_why(futile: int) -> str:
    return (f"stopped, not requeued: the last {futile} runs committed no checkpoint newer than the one they resumed "
            "from, so another run would most likely do the same (a requeue loop). The event log says what each run "
            "did; fix the cause and resubmit, or raise max_futile_runs")


def futile_runs(runs: list[Run]) -> int:
    """How many of the last runs, in a row, committed no checkpoint newer than the one they resumed from."""
    count = 0
    for run in reversed(runs):
        newest = max((s.get("step", -1) for s in run.all(Event.SAVE)), default=None)
        start = run.resumed_from
        if newest is not None and (start is None or newest > start):
            break
        count += 1
    return count


def after_failed_save(outcome: Outcome) -> Outcome:
    """A run that ends for good (all steps done, or the kill switch) without its last checkpoint has failed: its
    final state is not on disk. A stop that exits non-zero already says something went wrong, and a requeued run
    resumes from the checkpoint before."""
    return Outcome.FAILED if outcome in (Outcome.FINISHED, Outcome.KILL_SWITCH) else outcome


def at_time_limit(decision: StopDecision) -> bool:
    """The SIGTERM came at the job's end time: the time limit, which a requeue survives."""
    term, end = decision.term_time, decision.end_time
    return term is not None and end is not None and term >= end - TIME_LIMIT_TOLERANCE_S


def requeue(job_id: str, *, timeout_s: float = 30.0) -> tuple[bool, str]:
    """``scontrol requeue JOB``; returns (done, message)."""
    out = _slurm.run("scontrol", "requeue", job_id, timeout_s=timeout_s)
    if isinstance(out, str):
        return False, f"{out}: exiting with {int(ExitCode.REQUEUE_NEEDED)} so the batch script can requeue"
    if out.returncode != 0:
        return False, f"scontrol requeue {job_id} refused (exit {out.returncode}): {out.stderr.strip()}"
    return True, f"requeued {job_id}"
