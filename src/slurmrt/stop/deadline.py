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
import time
from collections import deque
from collections.abc import Callable, Mapping

from .. import _clock, _slurm
from ..launch import slurmvars

__all__ = ["Budget", "DurationEstimator", "EndTime", "PeriodicSaves", "end_time_from_env", "horizon", "query_end_time",
           "query_job_times",
           "time_is_short"]

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

    def recent_max(self) -> float:
        """The longest duration in the window (0 when empty); read by the watchdog's thread, not per step."""
        return max(tuple(self._samples), default=0.0)

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


def horizon(*, step_s: float | None, steps_ahead: int, save_s: float, margin_s: float,
            worst_step_s: float | None = None, saves: int = 1) -> float:
    """Seconds that ``steps_ahead`` more steps (one of them possibly as slow as ``worst_step_s``), ``saves`` saves
    (each budgeted at SAVE_SAFETY times ``save_s``) and the margin need: the one formula of the deadline."""
    step = step_s or 0.0
    outlier = max(0.0, (worst_step_s or 0.0) - step)
    return steps_ahead * step + outlier + saves * SAVE_SAFETY * save_s + margin_s


def time_is_short(*, now: float, end: float | None, step_s: float | None, steps_ahead: int, save_s: float,
                  margin_s: float, worst_step_s: float | None = None, saves: int = 1) -> bool:
    """True when :func:`horizon` seconds from ``now`` reach ``end``. All in seconds."""
    if end is None:
        return False
    return now + horizon(step_s=step_s, steps_ahead=steps_ahead, save_s=save_s, margin_s=margin_s,
                         worst_step_s=worst_step_s, saves=saves) >= end


def budget_saves(periodic: PeriodicSaves, *, now: float, step_s: float | None, steps_ahead: int, save_s: float,
                 margin_s: float, worst_step_s: float | None) -> int:
    """1, or 2 when a periodic save is due before the stop save could be done."""
    needed = horizon(step_s=step_s, steps_ahead=steps_ahead, save_s=save_s, margin_s=margin_s,
                     worst_step_s=worst_step_s)
    return 2 if periodic.due_within(now, needed) else 1


class Budget:
    """What a run has measured (step and save times, how often it saves on its own) and what it needs before the
    end: the one object every deadline question goes to.

    The training thread records; the agreement thread asks. Each estimate is read whole (a float or None), so a
    question asked between two records sees one or the other, never half of one.
    """

    def __init__(self, *, margin_s: float, save_time_s: float, kill_wait_s: float,
                 step_time_s: float | None = None) -> None:
        self.margin_s = margin_s
        self.kill_wait_s = kill_wait_s
        self.steps = DurationEstimator(window=64, skip=2, quantile=0.95, default=step_time_s)
        self.saves = DurationEstimator(window=4, quantile=1.0, default=save_time_s)
        self.periodic = PeriodicSaves()

    def step_done(self, seconds: float) -> None:
        self.steps.add(seconds)

    def save_done(self, seconds: float, *, started: float, periodic: bool) -> None:
        """A save took ``seconds``, started at wall time ``started``; ``periodic``: the loop's own schedule."""
        self.saves.add(seconds)
        if periodic:
            self.periodic.saved(started)

    def deadline_near(self, *, now: float, end: float | None, steps_ahead: int) -> bool:
        """The steps that may still run, a save (two when a periodic one falls due first) and the margin no longer
        fit before ``end``."""
        step_s, worst, save_s = self.steps.estimate(), self.steps.peak, self.saves.estimate() or 0.0
        saves = budget_saves(self.periodic, now=now, step_s=step_s, steps_ahead=steps_ahead, save_s=save_s,
                             margin_s=self.margin_s, worst_step_s=worst)
        return time_is_short(now=now, end=end, step_s=step_s, steps_ahead=steps_ahead, save_s=save_s,
                             margin_s=self.margin_s, worst_step_s=worst, saves=saves)

    def phase_fits(self, *, now: float, end: float, phase_s: float) -> bool:
        """A phase of ``phase_s`` and then a save (and the margin) still fit before ``end``: the one formula
        (:func:`horizon`) with the phase in place of steps."""
        save_s = self.saves.estimate() or 0.0
        return now + phase_s + horizon(step_s=None, steps_ahead=0, save_s=save_s, margin_s=self.margin_s) < end

    @classmethod
    def from_options(cls, *, margin_s: float, save_time_s: float, kill_wait_s: float, measured_step_s: float | None,
                     measured_save_s: float | None) -> Budget:
        """A run's budget: what the earlier runs of the job measured stands in until this run measures its own (a
        requeued run does not start from the default save time, and skip a save that takes 2 s, nor without a
        step time)."""
        if measured_step_s is not None or measured_save_s is not None:
            logger.info("earlier runs of the job measured a step of %s and a save of %s",
                        "-" if measured_step_s is None else f"{measured_step_s:.3g} s",
                        "-" if measured_save_s is None else f"{measured_save_s:.3g} s")
        return cls(margin_s=margin_s, save_time_s=measured_save_s or save_time_s, kill_wait_s=kill_wait_s,
                   step_time_s=measured_step_s)

    def save_fits_after_term(self, *, now: float, term_time: float, steps_ahead: int) -> bool:
        """After SIGTERM at ``term_time``, a save still fits before SIGKILL (``kill_wait_s`` later, Slurm's
        KillWait) once the steps that may still run are done, with a second to spare."""
        left = term_time + self.kill_wait_s - now - steps_ahead * (self.steps.estimate() or 0.0)
        return left - 1.0 >= (self.saves.estimate() or 0.0)


def start_time_from_env(env: Mapping[str, str]) -> float | None:
    """``SLURM_JOB_START_TIME`` (epoch seconds), set by Slurm 23.02 and newer; None when absent or 0."""
    return slurmvars.start_time(env)


def end_time_from_env(env: Mapping[str, str]) -> float | None:
    """``SLURM_JOB_END_TIME`` (epoch seconds), set by Slurm 23.02 and newer; None when absent or 0 (no limit).

    A malformed value is an error, not "no deadline": ignoring it silently turned the deadline off."""
    return slurmvars.end_time(env)


def query_end_time(job_id: str, *, timeout_s: float = 20.0) -> float | None:
    """Ask Slurm once: ``squeue -h -j JOB -o %e``. None for unlimited jobs, a missing squeue, or an error."""
    return query_job_times(job_id, timeout_s=timeout_s)[1]


def query_job_times(job_id: str, *, timeout_s: float = 20.0) -> tuple[float | None, float | None]:
    """Ask Slurm once: ``squeue -h -j JOB -o "%S %e"``: when this run of the job started and when it ends; None for
    what Slurm does not know (an unlimited job's end), a missing squeue, or an error."""
    out = _slurm.run("squeue", "-h", "-j", job_id, "-o", "%S %e", timeout_s=timeout_s)
    if isinstance(out, str):
        logger.warning("%s: no time-limit deadline for job %s until the next try", out, job_id)
        return None, None
    fields = (out.stdout.strip().splitlines() or [""])[0].split()
    if len(fields) != 2:
        logger.warning("squeue said %r for job %s, not a start and an end time: no deadline until the next try",
                       out.stdout[:200], job_id)
        return None, None
    start, end = parse_squeue_time(fields[0]), parse_squeue_time(fields[1])
    return start, end


def parse_squeue_time(text: str) -> float | None:
    """squeue prints the end time in the controller's local time, ``2026-11-21T12:00:00``; N/A or Unknown if none."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line or line in {"N/A", "Unknown", "NONE", "None"}:
        return None
    from datetime import datetime

    try:
        return datetime.strptime(line, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        logger.warning("cannot parse squeue end time %r: no deadline", line)
        return None


class EndTime:
    """The job's end time: ``SLURM_JOB_END_TIME`` when Slurm sets it, else asked of the scheduler by one process
    per job, at start and then every ``refresh_s`` (a time limit can be changed with ``scontrol update``).

    :meth:`poll` runs on the watcher thread; thousands of ranks asking ``squeue`` gets a user banned from slurmctld,
    so the other ranks learn the answer through the agreement.
    """

    def __init__(self, env: Mapping[str, str], *, job_id: str | None, ask: bool, refresh_s: float,
                 fetch: Callable[[str], tuple[float | None, float | None]] = query_job_times) -> None:
        self.from_env = end_time_from_env(env)
        #: When Slurm started this run of the job (``SLURM_JOB_START_TIME``, Slurm 23.02 and newer, or squeue's
        #: %S with the end time): the goodput ledger's start. None until known.
        self.started: float | None = start_time_from_env(env)
        self._job_id = job_id if ask and self.from_env is None else None
        self._refresh_s = refresh_s
        self._fetch = fetch
        self._next = 0.0
        self.queried: float | None = None
        self.queries = 0

    @property
    def asks(self) -> bool:
        return self._job_id is not None

    @property
    def value(self) -> float | None:
        return self.from_env or self.queried

    def poll(self) -> None:
        if self._job_id is None or _clock.mono() < self._next:
            return
        self._next = _clock.mono() + self._refresh_s
        self.queries += 1
        start, end = self._fetch(self._job_id)
        self.started = self.started or start
        if end != self.queried:
            logger.info("job %s ends at %s", self._job_id, _when(end))
        self.queried = end


def _when(end: float | None) -> str:
    """An end time as people read it: local time, with the date."""
    return "an unknown time" if end is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end))
