"""Running a Slurm command (``squeue``, ``scontrol``, ``scancel``): found on PATH, bounded in time, never raising."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["run"]


def run(command: str, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str] | str:
    """The finished process (whatever its exit code), or why it could not run, in words: not on PATH (a container
    without Slurm's client tools), an OSError, or no answer within ``timeout_s`` (slurmctld overloaded)."""
    path = shutil.which(command)
    if path is None:
        return f"{command} not found on PATH"
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`{command} {' '.join(args)}` failed: {err}"
