"""Every rank stops at the same step, and the per-step check costs almost nothing.

Protocol (one control thread per rank, a MAX all-reduce per round over :class:`slurmrt._tree.Tree`):

- Each round, every rank contributes its reasons to stop (signal seen, deadline near, kill switch), the last step it
  reached, and a few numbers the decision needs (end time, first SIGTERM, whether a save still fits).
- A round without reasons grants a *clearance* ``C = max step + W``: every rank may run steps below C without
  waiting. ``should_stop(step)`` is then one comparison; a rank waits only when it reaches C before the next round.
- A round with reasons decides ``stop at step C_prev`` -- the clearance of the round before, identical on every rank
  because it comes from reduced values. No rank can be past it: nobody passes C_prev without a newer round.
- ``W`` adapts so that training rarely waits (W >= 2, and enough steps to cover one and a half round periods); the
  ranks agree on it through the same reduction.

Rounds are paced by the stop latency a job needs, not by its step time. A round every quarter of a step, but never
more often than every ``min_interval_s`` (0.5 s) nor less often than every ``max_interval_s`` (1 s): the warning a
stop answers comes minutes before the end, SIGTERM 30 s before SIGKILL, and a stop within a second or two of either
is as good as one within a step. So the thread costs under one percent of a core whatever the step time (a round
is one to a few milliseconds of CPU, gloo's threads included), and its rounds hardly ever take the GIL from the
training thread. Stop latency is about W + 1 steps: 2-3 steps for steps longer than two seconds, and for faster ones
about one and a half round periods in time (under 2 s).

A round comes early when it is needed: a training thread that reaches its clearance wakes its control thread, which
enters the round at once (the other ranks, in step, reach the same clearance and do the same). That is what happens
before the step time is known (W = 2), and when steps turn faster than the window planned for.

The training thread never runs a collective for this, so a GPU job's step never synchronises with the GPU stream
or with the other ranks because of slurmrt.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import replace

from .. import _clock
from .._errors import AgreementError
from .._tree import Tree
from .decision import ContributeFn, Contribution, StopDecision, decode, encode
from .straggler import Timing

__all__ = ["Agreement", "DistributedAgreement", "LocalAgreement"]

logger = logging.getLogger(__name__)

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

    #: No thread, no rounds: nothing to start, end or fail.
    started = failed = False
    last_step: int | None = None

    def end_rounds(self) -> None:
        pass

    def abandon(self, *, collectively: bool) -> None:
        pass


class DistributedAgreement:
    """The clearance protocol above, over ``tree`` (a MAX all-reduce over all ranks in O(log N) hops)."""

    def __init__(self, contribute: ContributeFn, tree: Tree, *, min_interval_s: float = 0.5,
                 max_interval_s: float = 1.0, step_estimate: Callable[[], float | None] = lambda: None,
                 observe: Callable[[Timing], None] = lambda timing: None) -> None:
        """``observe`` is told each round's reduced timing (:mod:`slurmrt.stop.straggler`), on the control thread."""
        self._contribute = contribute
        self._observe = observe
        self._tree = tree
        self._min_interval = min_interval_s
        self._max_interval = max_interval_s
        self._step_estimate = step_estimate
        self._cond = threading.Condition()
        self._cleared = -1  # steps below this may run without waiting
        self._published = -1
        self.decision: StopDecision | None = None
        self.end_time: float | None = None
        self.window = 2
        self._leaving = False
        self._over = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._round_period: float | None = None
        self._abandon = threading.Event()
        #: Set to start the next round now: a training thread waits for clearance, the rounds end, or are abandoned.
        self._wake = threading.Event()

    @property
    def started(self) -> bool:
        """The rounds began (the control thread runs, or ran)."""
        return self._thread is not None

    @property
    def failed(self) -> bool:
        """A round failed: a peer is probably gone."""
        return self._error is not None

    @property
    def last_step(self) -> int | None:
        """The last step the training thread passed to should_stop (None before the first)."""
        return self._published if self._published >= 0 else None

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
        if self._over:
            return False  # the rounds are over: no thread, no collective, just finish the last steps
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slurmrt-agreement", daemon=True)
            self._thread.start()
        self._wake.set()  # the clearance is used up: the next round now, not at the end of the pause
        with self._cond:
            while True:
                if self._error is not None:
                    raise AgreementError(
                        f"the ranks can no longer agree on when to stop: {self._error!r}. A peer probably died; "
                        "this rank stops too rather than hang in its next collective",
                    ) from self._error
                if self.decision is not None and step >= self.decision.step:
                    return True
                if step < self._cleared or self._over:
                    return False
                self._cond.wait(1.0)

    def end_rounds(self, timeout_s: float = 60.0) -> None:
        """This rank left the training loop: end the rounds (collectively) and join the thread."""
        self._leaving = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("slurmrt agreement thread still running after %.0f s", timeout_s)

    def abandon(self, *, collectively: bool) -> None:
        """The interpreter exits without finish(): get the thread out of its round, and out of gloo's teardown.

        ``collectively`` (a normal exit that skipped finish()): end the rounds as finish() does first -- peers that
        are alive join the last round, dead ones make it fail fast; either way no round is left pending. After an
        uncaught exception, the thread only leaves: it waits in Python (see _run), so the flag gets it out.
        """
        if collectively and self._thread is not None:
            self._leaving = True
            self._wake.set()
            self._thread.join(10.0)
        self._abandon.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)

    # -- control thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        last = _clock.mono()
        try:
            while True:
                c = self._contribute(self._published, self.window + 1, self.end_time)
                c = replace(c, window=self._proposed_window(), leaving=self._leaving)
                tensor = torch.tensor(encode(c), dtype=torch.int64)
                if not self._tree.all_reduce_max(tensor, self._abandon):
                    return
                verdict = decode(tensor.tolist())
                self._judge(verdict.timing)
                now = _clock.mono()
                self._round_period = now - last
                last = now
                if self._apply(verdict):
                    return
                # Pause outside the lock; the round itself is the only blocking call.
                self._wake.wait(self._pause())
                self._wake.clear()
                if self._abandon.is_set():
                    return
        except BaseException as err:  # noqa: BLE001 - reported to the training thread, which raises
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _judge(self, timing: Timing) -> None:
        try:
            self._observe(timing)
        except Exception:  # naming a straggler must never cost the stop protocol
            logger.exception("slurmrt: the straggler check failed")

    def _apply(self, verdict: Contribution) -> bool:
        """Fold one round's reduced values into the state; True when the rounds are over."""
        with self._cond:
            if verdict.end_time is not None:
                self.end_time = verdict.end_time
            if verdict.leaving:
                # A rank finished its last step: every rank is about to finish too. A stop now would make the
                # others enter a save that the finished rank never joins.
                self._over = True
            elif verdict.reasons:
                step = self._cleared if self._cleared >= 0 else verdict.step
                self.decision = StopDecision(step, verdict.reasons, not verdict.save_unfit, self.end_time,
                                             verdict.term_time)
            else:
                self.window = verdict.window
                self._cleared = max(self._cleared, verdict.step + verdict.window)
            self._cond.notify_all()
            return self._over or self.decision is not None

    def _pause(self) -> float:
        """Seconds until the next round, unless woken: a quarter of a step, within [min_interval, max_interval]."""
        step_s = self._step_estimate()
        interval = self._min_interval if step_s is None else step_s / 4
        return min(max(interval, self._min_interval), self._max_interval)

    def _proposed_window(self) -> int:
        step_s = self._step_estimate()
        if not step_s or self._round_period is None:
            return 2
        # Enough steps to cover one and a half round periods, so the training thread rarely waits; the period is at
        # least the planned pause (a round that came early, woken by a waiting rank, says nothing about the next).
        period = max(self._round_period, self._pause())
        return max(2, min(1_000_000, math.ceil(1.5 * period / step_s) + 1))



Agreement = LocalAgreement | DistributedAgreement
