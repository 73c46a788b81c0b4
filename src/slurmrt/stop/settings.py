"""The options of an agreed stop: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>`` variable
(docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections, and the composer hands this
one to the stop controller.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from .._rules import Section, setting
from .signals import DEFAULT_SIGNALS

__all__ = ["StopSection"]


@dataclass(frozen=True, kw_only=True)
class StopSection(Section):
    """An agreed stop: the signals, the deadline, the kill switch, what paces the watcher, and stragglers."""

    signals: tuple[signal.Signals, ...] = setting(DEFAULT_SIGNALS, "signals")
    #: A path anyone may create to stop the job (or every task of an array) cleanly, without requeue.
    kill_switch: Path | None = setting(None, "path")
    deadline: bool = setting(True, "flag")
    #: Safety margin kept free before the job's end time, on top of the steps and the save.
    deadline_margin_s: float = setting(30.0, "seconds")
    #: Save time assumed until one has been measured.
    save_time_s: float = setting(30.0, "seconds")
    #: Slurm's KillWait: time between SIGTERM and SIGKILL.
    kill_wait_s: float = setting(30.0, "seconds")
    #: How often the watcher thread looks at what may stop or end the run between two steps: the kill switch, the
    #: job's end time, the lease's heartbeat and the hang watchdog. (Was ``kill_switch_poll_s``.)
    watch_interval_s: float = setting(5.0, "seconds", least=0.01)
    end_time_refresh_s: float = setting(900.0, "seconds", least=1.0)
    #: Rank 0 records its step in the event log this often (the timeline of ``slurmrt status``, ``slurmrt sim``).
    #: At least 1 s: a sample under a second wrote an event per step (2,583 events in 3 s).
    progress_s: float | None = setting(10.0, "seconds", least=1.0, optional=True)
    #: What a rank named a straggler (slurmrt.stop.straggler; measured by ``rt.time_compute()``) costs its node:
    #: "name" (the log, the event log, ``slurmrt status``), "exclude" (also left out at the next in-job restart or
    #: requeue, whatever causes it) or "replace" (also a stop now, a save, and a restart without the node: a new
    #: step on a spare under ``slurmrt run``, else a requeue with it excluded).
    straggler: str = setting("name", "choice", choices=("name", "exclude", "replace"))
    #: A straggler's timed section is at least 1 + this times the slowest rank's on the other nodes ...
    straggler_margin: float = setting(0.25, "fraction")
    #: ... in each of ``straggler_windows`` windows in a row, of ``straggler_window`` timed steps each.
    straggler_window: int = setting(20, "count", least=2)
    straggler_windows: int = setting(3, "count", least=1)
