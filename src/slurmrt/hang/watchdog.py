"""The hang watchdog: a training thread that makes no progress for longer than it plausibly could is hung.

The training thread pays one clock read per step for it (the stop controller's ``heartbeat``, which ``should_stop``
sets anyway); everything else runs on the watcher thread, every ``watch_interval_s``. What the thread is doing is an
:class:`Activity`, changed only at the rare boundaries (a save, a load, a phase, the first steps), and each kind gets
its own allowance:

- **steps**: ``STEP_FACTOR`` times the slowest of the recent steps, at least the floor (``hang_floor_s``, 180 s).
  With steps under a second that is 3 minutes, well inside NCCL's 10-minute and gloo's 30-minute collective
  timeouts. ``hang_timeout_s`` fixes it instead.
- **the warm-up steps** (the first should_stop to the 5th: the first compile, data-loader start-up):
  ``startup_timeout_s`` (20 minutes); nothing has been measured yet. Before the first should_stop nothing is
  watched but saves, loads and phases: the watchdog is on once steps are reported.
- **saves and loads**: ``IO_FACTOR`` times the slowest measured save (this run's, or the earlier runs'), at least
  the floor.
- **a phase** (``rt.phase("eval")``): ``PHASE_FACTOR`` times its longest measured duration, at least the floor; a
  phase never measured gets the start's allowance.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .. import _clock
from ..stop.deadline import Budget
from ..stop.state import Activity, PhaseTimes

__all__ = ["Hang", "Watchdog", "IO_FACTOR", "PHASE_FACTOR", "STEP_FACTOR", "WARMUP_STEPS"]

logger = logging.getLogger(__name__)

#: The step allowance is this multiple of the slowest recent step.
STEP_FACTOR = 10.0
#: Saves and loads: this multiple of the slowest measured save.
IO_FACTOR = 5.0
#: A phase: this multiple of its longest measured duration.
PHASE_FACTOR = 3.0
#: Steps measured (after the estimator's skipped ones) before the step allowance replaces the start's.
WARMUP_STEPS = 3


@dataclass(frozen=True)
class Hang:
    """The watchdog's finding: ``activity`` made no progress for ``idle_s``, more than its ``allowed_s``."""

    activity: Activity
    idle_s: float
    allowed_s: float


class Watchdog:
    """Polled by the watcher thread; calls ``on_hang`` once, when the activity outlives its allowance."""

    def __init__(self, budget: Budget, phases: PhaseTimes, *, heartbeat: Callable[[], float],
                 activity: Callable[[], Activity | None], on_hang: Callable[[Hang], None], floor_s: float,
                 startup_s: float, fixed_s: float | None = None,
                 probe: Callable[[float], None] | None = None) -> None:
        self._budget, self._phases = budget, phases
        self._heartbeat, self._activity, self._on_hang = heartbeat, activity, on_hang
        self.floor_s, self.startup_s, self.fixed_s = floor_s, startup_s, fixed_s
        self.fired: Hang | None = None
        #: Called with the idle seconds while the training thread is stalled but not yet past its allowance: the
        #: census looks for a hang another rank found (one store request per poll, only while stalled).
        self._probe = probe

    def allowance(self, activity: Activity) -> float:
        """Seconds ``activity`` may go without progress (see the module)."""
        if activity.kind == "step":
            steps = self._budget.steps
            if self.fixed_s is not None:
                return self.fixed_s
            if len(steps) < WARMUP_STEPS:
                return max(self.startup_s, self.floor_s)
            return max(self.floor_s, STEP_FACTOR * steps.recent_max())
        if activity.kind in ("save", "load"):
            save_s = self._budget.saves.estimate()
            return max(self.floor_s, IO_FACTOR * save_s) if save_s else max(self.floor_s, self.startup_s)
        if activity.kind == "phase":
            if activity.timeout_s is not None:
                return activity.timeout_s
            measured = self._phases.get(activity.name or "")
            return max(self.floor_s, PHASE_FACTOR * measured) if measured else max(self.startup_s, self.floor_s)
        return max(self.startup_s, self.floor_s)  # the start

    def idle(self, activity: Activity) -> float:
        """Seconds since the last progress: the last step boundary for steps, the activity's start otherwise."""
        last = max(self._heartbeat(), activity.since) if activity.kind == "step" else activity.since
        return _clock.mono() - last

    def overdue(self) -> bool:
        """Whether the activity has outlived its allowance now (whether or not :meth:`poll` saw it yet)."""
        activity = self._activity()
        return activity is not None and self.idle(activity) > self.allowance(activity)

    def poll(self) -> None:
        activity = self._activity()
        if activity is None or self.fired is not None:
            return
        idle, allowed = self.idle(activity), self.allowance(activity)
        if idle > allowed:
            self.fired = Hang(activity, idle, allowed)
            self._on_hang(self.fired)
        elif self._probe is not None and idle > self.probe_after(activity, allowed):
            self._probe(idle)

    def probe_after(self, activity: Activity, allowed: float) -> float:
        """Idle seconds after which the training thread counts as stalled: longer than any step lately."""
        if activity.kind == "step":
            return min(allowed / 2, max(5.0, 2 * self._budget.steps.recent_max()))
        return allowed / 2
