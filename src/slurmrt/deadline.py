"""Save before the time limit even when no signal comes.

Three inputs: the job's end time (Slurm's, asked once), the measured step time and the measured save time. The stop
comes when the steps that may still run before every rank can stop, plus a save, plus a safety margin no longer fit:
``now + steps_ahead * step + save + margin >= end``.

The step estimate is a high quantile of a window of recent steps, after skipping the first ones (compilation,
data-loader warm-up and cache misses make them slow): robust to jitter, and it follows a run whose step time drifts.
On top of it the budget reserves room for one step as slow as the slowest seen in the run (a data-loader stall, a
filesystem hiccup: rare, so a quantile misses them, but one at the wrong moment costs the checkpoint), and for a save
25 % slower than the slowest measured (shared filesystems vary from save to save). benchmarks/bench_time_limit.py
measures what each of these buys.
"""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
from collections import deque
from collections.abc import Mapping
from datetime import datetime

__all__ = ["DurationEstimator", "PeriodicSaves", "end_time_from_env", "query_end_time", "time_is_short"]

logger = logging.getLogger(__name__)


class DurationEstimator:
    """Quantile of the last ``window`` durations, ignoring the first ``skip``; ``default`` until one is measured."""

    def __init__(self, *, window: int = 64, skip: int = 0, quantile: float = 0.95,
                 default: float | None = None) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self._skip = skip
        self._quantile = quantile
        self.default = default
        #: The longest duration ever added (after the skipped ones), not only in the window.
        self.peak: float | None = None
        self._cached: float | None = None  # estimate() is read every step by a single process: sort only on change

    def add(self, seconds: float) -> None:
        if self._skip > 0:
            self._skip -= 1
            return
        self._samples.append(seconds)
        self._cached = None
        if self.peak is None or seconds > self.peak:
            self.peak = seconds

    def __len__(self) -> int:
        return len(self._samples)

    def estimate(self) -> float | None:
        if not self._samples:
            return self.default
        if self._cached is None:
            ordered = sorted(self._samples)
            index = min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)
            self._cached = ordered[max(index, 0)]
        return self._cached


class PeriodicSaves:
    """When the training loop saves on its own (every N steps or minutes), learn how often.

    A periodic save that starts right after a check said "time is fine" eats the room the stop save needed; the
    budget must hold both when the next periodic save is due within it.
    """

    def __init__(self) -> None:
        self._last: float | None = None
        self.interval: float | None = None

    def saved(self, started: float) -> None:
        if self._last is not None:
            self.interval = started - self._last
        self._last = started

    def due_within(self, now: float, seconds: float) -> bool:
        if self._last is None or self.interval is None:
            return False
        return now + seconds - self._last >= self.interval


#: A save is budgeted at this multiple of the slowest one measured.
SAVE_SAFETY = 1.25


def time_is_short(*, now: float, end: float | None, step_s: float | None, steps_ahead: int, save_s: float,
                  margin_s: float, worst_step_s: float | None = None, saves: int = 1) -> bool:
    """True when ``steps_ahead`` more steps (one of them possibly as slow as ``worst_step_s``), ``saves`` saves
    (each budgeted at SAVE_SAFETY times ``save_s``) and the margin would run past ``end``. All in seconds."""
    if end is None:
        return False
    step = step_s or 0.0
    outlier = max(0.0, (worst_step_s or 0.0) - step)
    return now + steps_ahead * step + outlier + saves * SAVE_SAFETY * save_s + margin_s >= end


def budget_saves(periodic: PeriodicSaves, *, now: float, step_s: float | None, steps_ahead: int, save_s: float,
                 margin_s: float, worst_step_s: float | None) -> int:
    """1, or 2 when a periodic save is due before the stop save could be done."""
    step = step_s or 0.0
    horizon = steps_ahead * step + max(0.0, (worst_step_s or 0.0) - step) + SAVE_SAFETY * save_s + margin_s
    return 2 if periodic.due_within(now, horizon) else 1


def end_time_from_env(env: Mapping[str, str]) -> float | None:
    """``SLURM_JOB_END_TIME`` (epoch seconds), set by Slurm 23.02 and newer; None when absent."""
    raw = env.get("SLURM_JOB_END_TIME")
    if raw and raw.strip().isdigit():
        return float(raw)
    return None


def query_end_time(job_id: str, *, timeout_s: float = 20.0) -> float | None:
    """Ask Slurm once: ``squeue -h -j JOB -o %e``. None for unlimited jobs, a missing squeue, or an error."""
    squeue = shutil.which("squeue")
    if squeue is None:
        logger.warning("squeue not found: the time-limit deadline is off for job %s (no end time)", job_id)
        return None
    try:
        out = subprocess.run([squeue, "-h", "-j", job_id, "-o", "%e"], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        logger.warning("squeue for job %s failed (%s): no deadline until the next try", job_id, err)
        return None
    return parse_squeue_time(out.stdout)


def parse_squeue_time(text: str) -> float | None:
    """squeue prints the end time in the controller's local time, ``2026-11-21T12:00:00``; N/A or Unknown if none."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line or line in {"N/A", "Unknown", "NONE", "None"}:
        return None
    try:
        return datetime.strptime(line, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        logger.warning("cannot parse squeue end time %r: no deadline", line)
        return None
