"""The state of one run that the stop controller writes and the hang monitor reads.

The :class:`~slurmrt.Runtime` builds one :class:`RunState` per run and hands it to both: the stop controller
(runtime/controller.py, the training thread) writes the last step boundary, what the training thread does, the
agreement once it runs, and the nodes a restart must leave out by the options; the hang monitor (the watcher thread)
reads them. Each field is one reference, written whole: a reader sees the old value or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import _clock
from ..stop.agreement import Agreement
from .watchdog import Activity

__all__ = ["RunState"]


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
