"""Stragglers: a rank whose own work is consistently slower than the other ranks', named with its node.

Step times cannot name a slow rank: in lockstep training every rank's step lasts as long as the slowest one's, since
the others wait for it in the gradient all-reduce. The time of a section without collectives can, so the measure is
opt-in: ``with rt.time_compute(): loss = model(batch)`` (the forward of DDP, a pipeline stage's compute). Each use
costs two clock reads and a few additions, on the training thread; nothing else runs there.

- **Windows.** Each rank closes a window every ``window`` timed sections: the mean section time, and the step time
  the stop controller measures (the median of the recent steps).
- **The reduction.** The agreement's rounds (:mod:`slurmrt.stop.agreement`, a MAX all-reduce) carry five more
  integers: the slowest rank's mean with its rank, the fastest mean, the range of the ranks' window numbers, and the
  longest step period. No extra collective, no extra round.
- **The judgement.** A round whose ranks all report the same window, newer than the last judged, judges it. The
  slowest rank is slow in that window when its mean is at least ``1 + margin`` times the fastest rank's and the
  difference costs at least :data:`MIN_COST` of a step (a rank that is 2x slower in a section that is 1 % of the
  step does not slow the job). It is named after ``windows`` judged windows in a row with the same rank slow.
- **Everyone agrees.** The judgement reads only reduced values, so every rank names the same straggler at the
  same round, and with ``straggler="replace"`` every rank raises the stop reason together.

Defaults: margin 0.25, windows of 20 timed steps, 3 windows: a rank 25 % slower (comparing against the fastest
rank, as NVIDIA's resiliency extension does) is named 60 to 80 timed steps after it slowed down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

__all__ = ["MIN_COST", "ComputeTimer", "Straggler", "StragglerJudge", "Timing"]

#: The least part of a step the straggler's extra time must cost before it is worth naming.
MIN_COST = 0.05
_RANK_BITS = 24  # 16 M ranks
_MAX_US = (1 << (62 - _RANK_BITS)) - 1
_NONE = -(2**62)
_now = time.perf_counter  # one global lookup per read, not two


@dataclass(frozen=True)
class Timing:
    """One rank's last window, or (reduced by MAX over the ranks) what every rank's windows say together."""

    #: ``mean_us << 24 | rank``: the MAX is the slowest rank's mean, with its rank.
    slowest: int = -1
    #: ``-mean_us``: the MAX is the fastest rank's mean, negated.
    neg_fastest: int = _NONE
    #: This rank's window number (-1: no window yet); reduced, the newest.
    window_hi: int = -1
    #: ``-window``: reduced, the oldest window any rank reports, negated.
    neg_window_lo: int = 1
    #: The step time when the window closed, in µs; reduced, the longest.
    step_us: int = 0

    def encode(self) -> list[int]:
        return [self.slowest, self.neg_fastest, self.window_hi, self.neg_window_lo, self.step_us]

    @classmethod
    def decode(cls, values: list[int]) -> Timing:
        return cls(*values)


@dataclass(frozen=True)
class Straggler:
    rank: int
    window: int
    #: The straggler's mean section time, the fastest rank's, and the step period, in seconds.
    slow_s: float
    fast_s: float
    step_s: float

    @property
    def ratio(self) -> float:
        return self.slow_s / self.fast_s if self.fast_s > 0 else float("inf")

    @property
    def cost(self) -> float:
        """The part of a step the difference costs the job."""
        return (self.slow_s - self.fast_s) / self.step_s if self.step_s > 0 else 0.0


class ComputeTimer:
    """``with timer:`` around a section without collectives, once per step; one object reused (no allocation).
    ``step_s`` gives the measured step time when a window closes (the stop controller's estimate)."""

    __slots__ = ("_count", "_start", "_step_s", "_sum", "published", "window")

    def __init__(self, window: int = 20, step_s: Callable[[], float | None] = lambda: None) -> None:
        self.window = window
        self._step_s = step_s
        self._start = 0.0
        self._sum = 0.0
        self._count = 0
        #: (window number, mean section µs, step time µs) of the last closed window; read by the control thread
        #: (one tuple, replaced whole).
        self.published: tuple[int, int, int] | None = None

    def __enter__(self) -> None:
        self._start = _now()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._sum += _now() - self._start
        self._count += 1
        if self._count >= self.window:
            self._close()

    def _close(self) -> None:
        step_s = self._step_s() or 0.0
        number = 0 if self.published is None else self.published[0] + 1
        self.published = (number, round(self._sum / self._count * 1e6), round(step_s * 1e6))
        self._sum, self._count = 0.0, 0

    def timing(self, rank: int) -> Timing:
        """This rank's part of a round."""
        last = self.published
        if last is None:
            return Timing()
        number, mean_us, step_us = last
        mean_us = min(max(mean_us, 0), _MAX_US)
        return Timing(mean_us << _RANK_BITS | rank, -mean_us, number, -number, step_us)


def slow_in(t: Timing, margin: float) -> Straggler | None:
    """The slowest rank of one reduced window when it is slow by the rules above, else None."""
    slow_us, rank = t.slowest >> _RANK_BITS, t.slowest & ((1 << _RANK_BITS) - 1)
    fast_us = -t.neg_fastest
    if fast_us <= 0 and slow_us <= 0:
        return None
    s = Straggler(rank, t.window_hi, slow_us / 1e6, fast_us / 1e6, t.step_us / 1e6)
    if slow_us < (1 + margin) * fast_us or s.cost < MIN_COST:
        return None
    return s


class StragglerJudge:
    """Judges each new window the rounds bring (the control thread); the same state on every rank."""

    def __init__(self, *, margin: float = 0.25, windows: int = 3) -> None:
        self.margin, self.windows = margin, windows
        self._judged = -1
        self._rank: int | None = None
        self._count = 0
        #: The straggler named last (None: none yet).
        self.named: Straggler | None = None

    def observe(self, t: Timing) -> Straggler | None:
        """One round's reduced timing; returns a straggler when this round names it (once per rank in a row)."""
        if t.window_hi < 0 or -t.neg_window_lo != t.window_hi or t.window_hi <= self._judged:
            return None  # no window yet, ranks on different windows (a round at a window's edge), or judged already
        self._judged = t.window_hi
        slow = slow_in(t, self.margin)
        if slow is None:
            self._rank, self._count = None, 0
            return None
        self._count = self._count + 1 if slow.rank == self._rank else 1
        self._rank = slow.rank
        if self._count < self.windows or (self.named is not None and self.named.rank == slow.rank):
            return None
        self.named = slow
        return slow
