"""Running a Slurm command (``squeue``, ``scontrol``, ``scancel``): found on PATH, bounded in time, never raising."""

from __future__ import annotations

import shutil
import signal
import subprocess

__all__ = ["available", "run"]


def available(command: str) -> bool:
    """Whether ``command`` is on PATH (a container may have none of Slurm's commands)."""
    return shutil.which(command) is not None


def run(command: str, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str] | str:
    """The finished process (whatever its exit code), or why it could not run, in words: not on PATH (a container
    without Slurm's client tools), an OSError, or no answer within ``timeout_s`` (slurmctld overloaded).

    The command ignores SIGTERM: Slurm sends it to every process of the job's tasks when the job is requeued or
    cancelled, and the ``scontrol update`` that must follow a requeue would die of it (measured: it did)."""
    path = shutil.which(command)
    if path is None:
        return f"{command} not found on PATH"
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout_s, check=False,
                              preexec_fn=_ignore_term)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`{command} {' '.join(args)}` failed: {err}"


def _ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
