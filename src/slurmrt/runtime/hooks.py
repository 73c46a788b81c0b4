"""Every process-global change slurmrt makes: made in :class:`ProcessHooks`, and undone there.

- Signal handlers that only record (:class:`~slurmrt.stop.signals.SignalRecorder`), from ``init()`` to ``close()``,
  and Slurm's warning signals blocked for the processes the program starts
  (:class:`~slurmrt.stop.signals.ChildShield`).
- This process's pid in the node-local pid files that ``slurmrt signal`` reads.
- An ``atexit`` handler, for a program that ends without ``finish()``: it gets the agreement thread out of its round
  before the interpreter tears gloo down.
- slurmrt's two gloo process groups (:func:`slurmrt._comm.open_groups`): made at the first call that needs them,
  which every rank reaches at the same point (``should_stop``, ``save`` or ``load_latest``), destroyed at close.

Nothing else in the package installs a signal handler, registers an atexit hook or creates a process group. Two
wrappers of ``sys.excepthook`` live beside what they answer: the one ``init()`` installs first for an uncaught
``ConfigError`` (:mod:`slurmrt.runtime.misconfigured`: one line per node, exit 78), and the one that files a lost
peer's traceback (:func:`slurmrt.hang.stacks.quiet_peer_tracebacks`). Each passes every other exception on.
"""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._comm import Groups, open_groups
from .._errors import ConfigError
from ..log import exit_now
from ..recovery.policy import ExitCode
from ..stop.agreement import Agreement
from ..stop.pidfiles import register_process, unregister_process
from ..stop.signals import ChildShield, SignalRecorder

__all__ = ["ProcessHooks", "exit_now"]

logger = logging.getLogger(__name__)


class ProcessHooks:
    def __init__(self, signals: SignalRecorder, *, job_id: str | None, world_size: int = 1) -> None:
        self.signals = signals
        self._shield = ChildShield(signals.signals)
        self._job_id = job_id
        self._world_size = world_size
        self._registration: Path | None = None
        self._groups: Groups | None = None
        self._agreement: Agreement | None = None
        self._installed = False
        #: Called with the exception that ends the program, if any (the hang response names a lost peer).
        self.on_uncaught: Callable[[BaseException | None], None] | None = None
        #: Called with the work group once the groups are open (every rank at the same point of its program).
        self.on_groups: Callable[[Any], None] | None = None

    def install(self) -> None:
        if not self.signals.install():
            logger.warning("slurmrt.init() was called outside the main thread: signals are not handled")
        self._shield.install()
        self._registration = register_process(self._job_id)
        # Registered at init, so the handlers a program registers later (a tracker's flush) run before this one.
        atexit.register(self._at_exit)
        self._installed = True

    def groups(self) -> Groups:
        """The control and work groups, made on first use (collectively: see the module docstring); then
        :attr:`on_groups` is told the work group (the hang monitor's census and start-up barrier), None for one
        process."""
        if self._groups is None:
            self._groups = open_groups(self._world_size)
            if self.on_groups is not None:
                self.on_groups(getattr(self._groups.work, "group", None))
        return self._groups

    def drop_groups(self) -> None:
        """Abort slurmrt's groups; the next call that needs them opens new ones on the default group of the time
        (an in-process restart, after the user's default group was rebuilt)."""
        groups, self._groups, self._agreement = self._groups, None, None
        if groups is not None:
            groups.abort()

    def reclaim_signals(self) -> None:
        """Put the signal recorders back where a framework replaced them with handlers of its own."""
        taken = self.signals.reclaim()
        if taken:
            logger.info("slurmrt's handlers for %s are back in place", ", ".join(s.name for s in taken))

    def watch(self, agreement: Agreement) -> None:
        """The agreement to take out of its rounds if the interpreter exits without finish()."""
        self._agreement = agreement

    def undo(self, *, destroy_groups: bool = True) -> None:
        """Put everything back. ``destroy_groups`` is False when a peer may be gone (gloo would wait for it)."""
        if not self._installed:
            return
        self._installed = False
        atexit.unregister(self._at_exit)
        self._shield.close()
        self.signals.close()
        unregister_process(self._registration)
        if self._groups is not None:
            self._groups.destroy(peers_alive=destroy_groups)

    def _at_exit(self) -> None:
        """The program ends without finish(), normally or by an uncaught exception.

        Tearing down the gloo groups while peers are dying or rounds are pending makes gloo's C++ threads call
        std::terminate ("terminate called without an active exception"): the rank would die of SIGABRT, with a core
        dump, instead of its real exit code. So the agreement thread leaves its round first; and after an uncaught
        exception, when the exit code is 1 whatever happens next, the process exits now, before that teardown. The
        atexit handlers registered after init() have run by then; those registered before it do not.
        """
        # The interpreter sets sys.last_value when an uncaught exception ends the program (not for SystemExit).
        uncaught = getattr(sys, "last_value", None) is not None
        if uncaught and self.on_uncaught is not None:
            self.on_uncaught(sys.last_value)  # exits the process when a peer is lost
        agreement = self._agreement
        if agreement is None or not agreement.started:
            return
        agreement.abandon(collectively=not uncaught)
        if uncaught:  # a misconfiguration keeps its own code: nothing requeues it (runtime/misconfigured.py)
            exit_now(ExitCode.CONFIG if isinstance(sys.last_value, ConfigError) else 1)
