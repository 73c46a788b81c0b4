"""The state of one run that the stop controller writes and the hang monitor reads: what the training thread does
(:class:`Activity`), the phases' measured lengths (:class:`PhaseTimes`), and the :class:`RunState` that holds the
step boundary, the activity, the agreement and the nodes to leave out.

``build_run`` (runtime/parts.py) makes one :class:`RunState` per run and hands it to both: the stop controller
(stop/controller.py, the training thread) writes the last step boundary, what the training thread does, the
agreement once it runs, and the nodes a restart must leave out by the options; the hang monitor (the watcher thread)
reads them. Each field is one reference, written whole: a reader sees the old value or the new one. It lives below
both, here, so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .. import _clock
from .agreement import Agreement

__all__ = ["Activity", "PhaseTimes", "RunState"]


@dataclass(frozen=True)
class Activity:
    """What the training thread is doing since ``since`` (monotonic seconds)."""

    kind: str  # "start", "step", "save", "load" or "phase"
    since: float
    name: str | None = None  # the phase's name
    timeout_s: float | None = None  # a phase's own allowance, when the user gave one

    def resumed(self, now: float) -> Activity:
        """The same activity, taken up again at ``now`` after a nested one (a save inside a phase)."""
        return replace(self, since=now)

    def describe(self) -> str:
        return f"phase {self.name!r}" if self.kind == "phase" else {"start": "the start (before the first steps)",
                                                                      "step": "a training step"}.get(self.kind,
                                                                                                     self.kind)


class PhaseTimes:
    """The longest measured duration of each named phase (this run's, and the earlier runs' from the event log)."""

    def __init__(self, earlier: dict[str, float] | None = None) -> None:
        self.longest: dict[str, float] = dict(earlier or {})

    def add(self, name: str, seconds: float) -> None:
        self.longest[name] = max(seconds, self.longest.get(name, 0.0))

    def get(self, name: str) -> float | None:
        return self.longest.get(name)


@dataclass
class RunState:
    #: Monotonic time of the last step boundary (or the last save, load or phase end).
    heartbeat: float = field(default_factory=_clock.mono)
    #: What the training thread does (the watchdog's view); None until the first step, and after the run closed.
    activity: Activity | None = None
    #: The agreement on when to stop, once the first step opened it.
    agreement: Agreement | None = None
    #: Nodes a restart must leave out besides the suspects, by the options (a straggler's).
    exclude: tuple[str, ...] = ()
    #: Whether the watchdog would find the training thread past its allowance now (the hang monitor's, when it
    #: watches): a rank frozen or stuck that a signal wakes. Asked only when a signal arrived.
    overdue: Callable[[], bool] = lambda: False
    #: The peers srun saw end, in words ("rank 1 (Killed, on n2)"), or None (the hang monitor's, under ``slurmrt
    #: run``): why Slurm takes the step down when SIGTERM comes. Asked only when a signal arrived.
    peers_ended: Callable[[], str | None] = lambda: None
