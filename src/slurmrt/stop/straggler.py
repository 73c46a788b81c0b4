"""Stragglers: a rank whose own work is consistently slower than the other ranks', named with its node.

Step times cannot name a slow rank (in lockstep training every rank waits for the slowest in the all-reduce), so
the measure is a section without collectives that the script times: ``with rt.time_compute(): ...``, two clock
reads and two reads of the thread's scheduler statistics per use, on the training thread (RESULTS.md has the cost).

- **A rank's own time.** Each section leaves out the time the thread waited in the run queue for a core inside it
  (``/proc/thread-self/schedstat``, read as the section starts and ends): a throttled or stopped node still shows,
  whole, and a rank starved of CPU on an oversubscribed machine does not. (Scaling a window's mean by the thread's
  share of its runnable time, as this did first, shrank a stopped node's stopped time with the wait.)
- **Windows** of ``window`` timed sections each; the agreement's rounds (a MAX all-reduce) carry the window's
  figures, with no collective of their own.
- **Against the slowest rank elsewhere**, not the fastest: a window is slow when its slowest rank is on the
  suspect's node again, at least ``1 + margin`` times the slowest mean outside that node, and the difference costs
  at least :data:`MIN_COST` of a step. That difference is what leaving the node out would save.
- **Named** after ``windows`` slow windows in a row. Every rank reads the same reduced values, so every rank names
  the same straggler at the same round, and with ``straggler="replace"`` raises the stop together.

Why these choices, and what they cost: ``benchmarks/RESULTS.md``, "Stragglers, and recovery in the simulator".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

__all__ = ["MIN_COST", "ComputeTimer", "Straggler", "StragglerJudge", "Timing"]

#: The least part of a step the straggler's extra time must cost before it is worth naming.
MIN_COST = 0.05
_RANK_BITS = 24  # 16 M ranks
_MAX_US = (1 << (62 - _RANK_BITS)) - 1
_now = time.perf_counter  # one global lookup per read, not two
_pread = os.pread
#: This thread's scheduler statistics: time on a core, time waiting in the run queue (ns), time slices. The wait is
#: brought up to date whenever the thread gets a core, so a running thread reads its own wait whole.
SCHEDSTAT = "/proc/thread-self/schedstat"


def _open_schedstat() -> int:
    """A descriptor of the calling thread's scheduler statistics (``/proc/thread-self`` names the thread that
    opens it), or -1 where they cannot be read."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        if len(_pread(fd, 64, 0).split()) >= 2:
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


@dataclass(frozen=True)
class Timing:
    """One rank's last window, or (reduced by MAX over the ranks) what every rank's windows say together."""

    #: ``mean_us << 24 | rank``: the MAX is the slowest rank's mean, with its rank.
    slowest: int = -1
    #: ``mean_us << 24 | node``: the MAX is the slowest rank's mean, with its node (the unit a restart leaves out).
    slowest_node: int = -1
    #: ``mean_us`` outside the suspect's node, else -1: the MAX is the slowest mean elsewhere.
    others: int = -1
    #: This rank's window number (-1: no window yet); reduced, the newest.
    window_hi: int = -1
    #: ``-window``: reduced, the oldest window any rank reports, negated.
    neg_window_lo: int = 1
    #: The step time when the window closed, in µs; reduced, the longest.
    step_us: int = 0

    def encode(self) -> list[int]:
        return [self.slowest, self.slowest_node, self.others, self.window_hi, self.neg_window_lo, self.step_us]

    @classmethod
    def decode(cls, values: list[int]) -> Timing:
        return cls(*values)


@dataclass(frozen=True)
class Straggler:
    rank: int
    window: int
    #: The straggler's mean section time, the slowest mean on the other nodes, and the step period, in seconds.
    slow_s: float
    others_s: float
    step_s: float

    @property
    def ratio(self) -> float:
        return self.slow_s / self.others_s if self.others_s > 0 else float("inf")

    @property
    def cost(self) -> float:
        """The part of a step the difference costs the job: what leaving the straggler's node out would save."""
        return (self.slow_s - self.others_s) / self.step_s if self.step_s > 0 else 0.0


class ComputeTimer:
    """``with timer:`` around a section without collectives, once per step; one object reused (no allocation).
    ``step_s`` gives the measured step time when a window closes (the stop controller's estimate). The thread
    that times the first section is the one whose scheduler statistics are read (the training thread)."""

    __slots__ = ("_count", "_fd", "_opened", "_start", "_step_s", "_sum", "_wait0", "_waited", "published", "window")

    def __init__(self, window: int = 20, step_s: Callable[[], float | None] = lambda: None) -> None:
        self.window = window
        self._step_s = step_s
        self._start = 0.0
        self._sum = 0.0
        self._count = 0
        self._fd = -1
        self._opened = False
        #: The timing thread's run-queue wait when the section began, and the window's wait inside sections (ns).
        self._wait0 = 0
        self._waited = 0
        #: (window number, mean section µs, step time µs) of the last closed window; read by the control thread
        #: (one tuple, replaced whole).
        self.published: tuple[int, int, int] | None = None

    def __enter__(self) -> None:
        if not self._opened:
            self._opened = True
            self._fd = _open_schedstat()
        self._wait0 = self._wait()
        self._start = _now()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._sum += _now() - self._start
        self._waited += self._wait() - self._wait0
        self._count += 1
        if self._count >= self.window:
            self._close()

    def _wait(self) -> int:
        """The timing thread's time in the run queue so far, in ns (0: not known)."""
        if self._fd < 0:
            return 0
        try:
            return int(_pread(self._fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):  # the thread is gone, or the format is not the one known
            os.close(self._fd)
            self._fd = -1
            self._wait0 = 0  # the section under way is measured as wall time, as the next ones are
            return 0

    def _close(self) -> None:
        step_s = self._step_s() or 0.0
        number = 0 if self.published is None else self.published[0] + 1
        # the thread's own time: the sections' wall time less their wait for a core (never below nothing)
        mean = max(self._sum - self._waited * 1e-9, 0.0) / self._count
        self.published = (number, round(mean * 1e6), round(step_s * 1e6))
        self._sum, self._count, self._waited = 0.0, 0, 0

    def timing(self, rank: int, node: int, suspect: int | None) -> Timing:
        """This rank's part of a round: ``node`` is its node (its rank, in a job on one node), ``suspect`` the
        judge's (the same on every rank at every round)."""
        last = self.published
        if last is None:
            return Timing()
        number, mean_us, step_us = last
        mean_us = min(max(mean_us, 0), _MAX_US)
        return Timing(mean_us << _RANK_BITS | rank, mean_us << _RANK_BITS | node,
                      -1 if node == suspect else mean_us, number, -number, step_us)


def _split(packed: int) -> tuple[int, int]:
    return packed >> _RANK_BITS, packed & ((1 << _RANK_BITS) - 1)


def slow_in(t: Timing, margin: float, suspect: int | None) -> Straggler | None:
    """The slowest rank of one reduced window when it is slow by the rules above, else None."""
    slow_us, rank = _split(t.slowest)
    node = _split(t.slowest_node)[1]
    if suspect is None or node != suspect or t.others <= 0:
        return None  # no suspect yet, a new one, or no rank elsewhere to compare with
    s = Straggler(rank, t.window_hi, slow_us / 1e6, t.others / 1e6, t.step_us / 1e6)
    if slow_us < (1 + margin) * t.others or s.cost < MIN_COST:
        return None
    return s


class StragglerJudge:
    """Judges each new window the rounds bring (the control thread); the same state on every rank."""

    def __init__(self, *, margin: float = 0.25, windows: int = 3) -> None:
        self.margin, self.windows = margin, windows
        self._judged = -1
        #: The node (the rank, in a job on one node) of the slowest rank of the last judged window.
        self.suspect: int | None = None
        self._count = 0
        #: The straggler named last (None: none yet).
        self.named: Straggler | None = None

    def observe(self, t: Timing) -> Straggler | None:
        """One round's reduced timing; returns a straggler when this round names it (once per rank in a row)."""
        if t.window_hi < 0 or -t.neg_window_lo != t.window_hi or t.window_hi <= self._judged:
            return None  # no window yet, ranks on different windows (a round at a window's edge), or judged already
        self._judged = t.window_hi
        slow = slow_in(t, self.margin, self.suspect)
        self.suspect = _split(t.slowest_node)[1] if t.slowest_node >= 0 else None
        self._count = 0 if slow is None else self._count + 1
        if slow is None or self._count < self.windows or (self.named is not None and self.named.rank == slow.rank):
            return None
        self.named = slow
        return slow
