"""How a run ends: the exit code that tells ``sacct`` why, and requeueing the job through ``scontrol``."""

from __future__ import annotations

import enum
import logging
import shutil
import subprocess

__all__ = ["ExitCode", "requeue"]

logger = logging.getLogger(__name__)


class ExitCode(enum.IntEnum):
    """Exit codes of :meth:`slurmrt.Runtime.exit`.

    The kill switch exits 0 like a finished run (``KILL_SWITCH`` is an alias of ``FINISHED``) so that the remaining
    tasks of a job array drain as COMPLETED rather than FAILED; the event log tells the two apart.
    """

    FINISHED = 0
    KILL_SWITCH = 0
    FAILED = 1
    #: Stopped after a checkpoint, and the job was requeued (by slurmrt, or Slurm requeues it: preemption).
    REQUEUED = 3
    #: Stopped, and not to be requeued: scancel, SIGINT, SIGTERM before the time limit, max restarts reached.
    STOPPED = 4
    #: Stopped for a requeue that slurmrt could not make (no scontrol in a container, requeue refused): a batch
    #: script may run `scontrol requeue` itself when it sees this code (EX_TEMPFAIL: "try again later").
    REQUEUE_NEEDED = 75


def requeue(job_id: str, *, timeout_s: float = 30.0) -> tuple[bool, str]:
    """``scontrol requeue JOB``; returns (done, message)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        code = int(ExitCode.REQUEUE_NEEDED)
        return False, f"scontrol not found on PATH: exiting with {code} so the batch script can requeue"
    try:
        out = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True, timeout=timeout_s,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"scontrol requeue {job_id} failed: {err}"
    if out.returncode != 0:
        return False, f"scontrol requeue {job_id} refused (exit {out.returncode}): {out.stderr.strip()}"
    return True, f"requeued {job_id}"
