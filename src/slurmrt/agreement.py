"""Every rank stops at the same step, and the per-step check costs almost nothing.

Protocol (one control thread per rank, a private gloo group, a MAX all-reduce per round):

- Each round, every rank contributes its reasons to stop (signal seen, deadline near, kill switch), the last step it
  reached, and a few numbers the decision needs (end time, first SIGTERM, whether a save still fits).
- A round without reasons grants a *clearance* ``C = max step + W``: every rank may run steps below C without
  waiting. ``should_stop(step)`` is then one comparison; a rank waits only when it reaches C before the next round.
- A round with reasons decides ``stop at step C_prev`` -- the clearance of the round before, identical on every rank
  because it comes from reduced values. No rank can be past it: nobody passes C_prev without a newer round.
- ``W`` adapts so that training rarely waits (W >= 2, and larger when steps are faster than rounds); the ranks agree on
  it through the same reduction. Stop latency is about W + 1 steps: 2-3 for steps longer than a round.

The training thread never runs a collective for this, so a GPU job's step never synchronises with the GPU stream
or with the other ranks because of slurmrt. Rounds are paced to a fraction of the step time (a few ms at least), so
the thread costs about one percent of a core.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import _clock
from ._errors import AgreementError
from .comm import wait_released

__all__ = ["Contribution", "DistributedAgreement", "LocalAgreement", "Reason", "StopDecision"]

logger = logging.getLogger(__name__)


class Reason(enum.Enum):
    """Why a run stops. Ordered from the mildest to the most final."""

    SIGNAL = "signal"  # the --signal warning (USR1/USR2 by default): time is nearly up, or preemption is coming
    DEADLINE = "deadline"  # no signal, but the next steps plus a save would run past the job's end time
    TERM = "sigterm"  # time limit, preemption or scancel
    INTERRUPT = "sigint"  # Ctrl-C, or `scancel --signal=INT`
    KILL_SWITCH = "kill_switch"  # someone created the kill-switch file


_REASONS = tuple(Reason)
#: Tensors of rounds abandoned at exit while gloo may still hold them (see _wait_in_python).
_abandoned: list[Any] = []
_NONE = -(2**62)


@dataclass(frozen=True)
class Contribution:
    """What one rank knows at one round."""

    reasons: frozenset[Reason] = frozenset()
    step: int = -1
    window: int = 2
    end_time: float | None = None
    term_time: float | None = None
    save_unfit: bool = False
    finish: bool = False


@dataclass(frozen=True)
class StopDecision:
    """The agreed stop: the same object on every rank."""

    step: int
    reasons: frozenset[Reason]
    #: False when SIGTERM came and the measured save time does not fit before SIGKILL.
    save: bool
    end_time: float | None = None
    term_time: float | None = None

    @property
    def reason(self) -> Reason:
        """The most final of the reasons."""
        return max(self.reasons, key=_REASONS.index)


def encode(c: Contribution) -> list[int]:
    """A MAX all-reduce of these integers is the union of reasons, the max step, the earliest SIGTERM, ..."""
    return [
        *(int(r in c.reasons) for r in _REASONS),
        c.step,
        c.window,
        int(c.end_time) if c.end_time is not None else _NONE,
        -int(c.term_time * 1000) if c.term_time is not None else _NONE,  # max of -t is -(min t)
        int(c.save_unfit),
        int(c.finish),
    ]


def decode(values: list[int]) -> Contribution:
    n = len(_REASONS)
    flags, (step, window, end, neg_term, unfit, finish) = values[:n], values[n:]
    return Contribution(
        reasons=frozenset(r for r, f in zip(_REASONS, flags, strict=True) if f),
        step=step,
        window=window,
        end_time=float(end) if end != _NONE else None,
        term_time=-neg_term / 1000 if neg_term != _NONE else None,
        save_unfit=bool(unfit),
        finish=bool(finish),
    )


ContributeFn = Callable[[int, int, "float | None"], Contribution]
"""(last step reached, steps that may still run before a stop, agreed end time) -> this rank's contribution."""


class LocalAgreement:
    """One process: the decision is this process's own, taken at the step it is seen."""

    def __init__(self, contribute: ContributeFn) -> None:
        self._contribute = contribute
        self.decision: StopDecision | None = None
        self.end_time: float | None = None

    def should_stop(self, step: int) -> bool:
        if self.decision is not None:
            return step >= self.decision.step
        c = self._contribute(step, 1, None)
        if c.reasons:
            self.decision = StopDecision(step, c.reasons, not c.save_unfit, c.end_time, c.term_time)
            return True
        return False

    def finish(self) -> None:
        pass


class DistributedAgreement:
    """The clearance protocol above, over ``group`` (a gloo process group of all ranks)."""

    def __init__(self, contribute: ContributeFn, group: Any, *, min_interval_s: float = 0.005,
                 max_interval_s: float = 0.5, step_estimate: Callable[[], float | None] = lambda: None) -> None:
        self._contribute = contribute
        self._group = group
        self._min_interval = min_interval_s
        self._max_interval = max_interval_s
        self._step_estimate = step_estimate
        self._cond = threading.Condition()
        self._cleared = -1  # steps below this may run without waiting
        self._published = -1
        self.decision: StopDecision | None = None
        self.end_time: float | None = None
        self.window = 2
        self.rounds = 0
        self._finishing = False
        self._finished = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._round_period: float | None = None
        self._abandon = threading.Event()

    # -- training thread -------------------------------------------------------------------------------------------
    def should_stop(self, step: int) -> bool:
        self._published = step
        decision = self.decision
        if decision is not None and step >= decision.step:
            return True
        if step < self._cleared:
            return False
        return self._wait(step)

    def _wait(self, step: int) -> bool:
        if self._finished:
            return False  # the rounds are over: no thread, no collective, just finish the last steps
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slurmrt-agreement", daemon=True)
            self._thread.start()
            atexit.register(self._leave_before_exit)
            self._previous_excepthook = sys.excepthook
            sys.excepthook = self._record_uncaught
        with self._cond:
            while True:
                if self._error is not None:
                    raise AgreementError(
                        f"the ranks can no longer agree on when to stop: {self._error!r}. A peer probably died; "
                        "this rank stops too rather than hang in its next collective",
                    ) from self._error
                if self.decision is not None and step >= self.decision.step:
                    return True
                if step < self._cleared or self._finished:
                    return False
                self._cond.wait(1.0)

    def finish(self, timeout_s: float = 60.0) -> None:
        """This rank left the training loop: end the rounds (collectively) and join the thread."""
        self._finishing = True
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("slurmrt agreement thread still running after %.0f s", timeout_s)
            atexit.unregister(self._leave_before_exit)
            if sys.excepthook == self._record_uncaught:
                sys.excepthook = self._previous_excepthook

    def _record_uncaught(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        self._uncaught = True
        self._previous_excepthook(kind, value, tb)

    _uncaught = False

    def _leave_before_exit(self) -> None:
        """The interpreter exits without finish(): get the thread out of its round, and out of gloo's teardown.

        Tearing down the gloo groups while peers are dying or rounds are pending makes gloo's C++ threads call
        std::terminate ("terminate called without an active exception"): the rank dies of SIGABRT, with a core dump,
        instead of its real exit code. The thread only ever waits in Python (see _run), so the flag gets it out; and
        when an uncaught exception is why we are exiting, the exit code is 1 whatever happens next, so exit now,
        before that teardown, once the atexit handlers registered before ours have run.
        """
        if not self._uncaught and self._thread is not None:
            # A normal exit that skipped finish(): end the rounds collectively, as finish() does. Peers that are
            # alive join the last round; dead ones make it fail fast. Either way no round is left pending.
            self._finishing = True
            self._thread.join(10.0)
        self._abandon.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._uncaught:
            # The handlers registered before ours (a tracker's flush, TensorBoard's writer) still run: atexit runs
            # the newest first, so they are the ones left. Run them now, then leave before gloo's teardown.
            atexit.unregister(self._leave_before_exit)
            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            logging.shutdown()
            os._exit(1)

    # -- control thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        import torch
        import torch.distributed as dist

        last = _clock.mono()
        try:
            while True:
                c = self._contribute(self._published, self.window + 1, self.end_time)
                c = replace(c, window=self._proposed_window(), finish=self._finishing)
                tensor = torch.tensor(encode(c), dtype=torch.int64)
                # No local name for the work object: _wait_in_python must hold the last reference to drop it.
                if not self._wait_in_python(dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group,
                                                            async_op=True), tensor):
                    return
                verdict = decode(tensor.tolist())
                now = _clock.mono()
                self._round_period = now - last
                last = now
                if self._apply(verdict):
                    return
                step_s = self._step_estimate()
                interval = self._min_interval if step_s is None else step_s / 4
                # Sleep outside the lock; the round itself is the only blocking call.
                if self._abandon.wait(min(max(interval, self._min_interval), self._max_interval)):
                    return
        except BaseException as err:  # noqa: BLE001 - reported to the training thread, which raises
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _wait_in_python(self, work: Any, tensor: Any) -> bool:
        """Wait for ``work`` with short sleeps rather than inside C++; False when told to abandon it.

        Returns once gloo's worker thread has dropped ``tensor`` too, so that it never frees a Python object (see
        :mod:`slurmrt.comm`: doing so while the interpreter finalizes aborts the process)."""
        pause = 0.0001
        while not work.is_completed():
            if self._abandon.is_set():
                _abandoned.append(tensor)  # the worker still holds it: never let the worker own the last reference
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.002)
        work.wait()  # completed: returns at once, or raises the round's error
        del work
        wait_released(tensor)
        return True

    def _apply(self, verdict: Contribution) -> bool:
        """Fold one round's reduced values into the state; True when the rounds are over."""
        with self._cond:
            self.rounds += 1
            if verdict.end_time is not None:
                self.end_time = verdict.end_time
            if verdict.finish:
                # A rank finished its last step: every rank is about to finish too. A stop now would make the
                # others enter a save that the finished rank never joins.
                self._finished = True
            elif verdict.reasons:
                step = self._cleared if self._cleared >= 0 else verdict.step
                self.decision = StopDecision(step, verdict.reasons, not verdict.save_unfit, self.end_time,
                                             verdict.term_time)
            else:
                self.window = verdict.window
                self._cleared = max(self._cleared, verdict.step + verdict.window)
            self._cond.notify_all()
            return self._finished or self.decision is not None

    def _proposed_window(self) -> int:
        step_s = self._step_estimate()
        period = self._round_period
        if not step_s or not period:
            return 2
        # Enough steps to cover one and a half round periods, so the training thread rarely waits.
        return max(2, min(10_000, math.ceil(1.5 * period / step_s) + 1))

