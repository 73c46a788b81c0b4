"""How a run ends: its :class:`Outcome`, the exit code that tells ``sacct`` why; the requeue-loop count read from the
event log; ``scontrol requeue``. Which outcome a run gets is :func:`slurmrt.recovery.plan.plan`'s to say.
"""

from __future__ import annotations

import enum

from .. import _slurm
from ..record.events import Event
from ..record.runs import Run
from ..stop.decision import StopDecision

__all__ = ["ExitCode", "Outcome", "at_time_limit", "futile_runs", "futile_why", "requeue"]

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
    #: ``init()`` or a later call found the launch, the environment or an option misconfigured (a
    #: :class:`~slurmrt.ConfigError` nobody caught): every run would fail the same way, so nothing requeues it
    #: (EX_CONFIG).
    CONFIG = 78


class Outcome(enum.Enum):
    """How the run ended; each outcome has one exit code, and the event log records the outcome's name."""

    FINISHED = ExitCode.FINISHED, "all steps done"
    KILL_SWITCH = ExitCode.FINISHED, "the kill switch stopped it; not requeued"
    REQUEUED = ExitCode.REQUEUED, "stopped for a requeue"
    STOPPED = ExitCode.STOPPED, "stopped; not requeued"
    REQUEUE_NEEDED = ExitCode.REQUEUE_NEEDED, "stopped for a requeue that slurmrt could not make"
    FAILED = ExitCode.FAILED, "ended for good, but its last checkpoint failed"
    HUNG = ExitCode.HUNG, "a rank hung"
    #: A rank's process or its node was lost (srun saw it end, killed or on a signal; a collective failed on its
    #: closed connection; Slurm took the node): the same code as a hang, and the record says which it was.
    PEER_LOST = ExitCode.HUNG, "a peer's process or node was lost"
    UNHEALTHY = ExitCode.UNHEALTHY, "a node failed the start-up health check"

    def __init__(self, code: ExitCode, meaning: str) -> None:
        self.code = code
        self.meaning = meaning


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
