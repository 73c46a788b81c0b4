"""The clocks slurmrt reads. Tests replace these two functions to fast-forward time (a process-boundary fake)."""

from __future__ import annotations

import time


def wall() -> float:
    """Seconds since the epoch: compared with Slurm's end time, which is wall-clock."""
    return time.time()


def mono() -> float:
    """Monotonic seconds: step and save durations."""
    return time.monotonic()
