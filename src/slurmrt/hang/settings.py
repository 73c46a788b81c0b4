"""The hang watchdog's options: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>`` variable
(docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections, and the composer hands this
one to the hang monitor.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._rules import Section, setting

__all__ = ["HangSection"]


@dataclass(frozen=True, kw_only=True)
class HangSection(Section):
    """The hang watchdog (slurmrt.hang.watchdog), its census, and the node's health check."""

    #: On by default.
    watchdog: bool = setting(True, "flag")
    #: A fixed allowance for one training step; None: learned from the measured steps (10x the slowest recent one).
    hang_timeout_s: float | None = setting(None, "seconds", least=0.01, optional=True)
    #: The least allowance the watchdog ever gives a step, a save, a load or a phase.
    hang_floor_s: float = setting(180.0, "seconds", least=0.01)
    #: The allowance from init() to the end of the warm-up steps, and for a phase never measured.
    startup_timeout_s: float = setting(1200.0, "seconds", least=0.01)
    #: How long a hang's census waits for every rank's answer; None: 3 watch intervals, at least 10 s.
    census_wait_s: float | None = setting(None, "seconds", least=0.01, optional=True)
    #: Check the node at start-up (CUDA, /dev/shm, the checkpoint directory) and the communication at the first
    #: collective; a failed check excludes the node and requeues the job.
    health_check: bool = setting(False, "flag")
