"""Signal handlers that only record.

A handler runs between two bytecodes of whatever the main thread was doing -- possibly inside a collective, a
``torch.save`` or a lock held by the logging module. Doing work there (saving, ``scontrol``, logging) is how jobs
deadlock (Lightning #21406). So a handler here stores (signal, time) in a dict and returns; everything else happens
at the next step boundary in :meth:`slurmrt.Runtime.should_stop`.

Slurm sends SIGTERM more than once to some tasks at the time limit (docs/slurm.md); only the first arrival time
is kept, later ones just count.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from .. import _clock
from .._rules import parse_signal

__all__ = ["DEFAULT_SIGNALS", "SignalRecorder", "parse_signal"]

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], Any] | int | None


class SignalRecorder:
    """Installs recording handlers; :meth:`close` puts the previous ones back (a warning signal's default, to die,
    becomes ignored: see :func:`_after`)."""

    def __init__(self, signals: Iterable[signal.Signals] = DEFAULT_SIGNALS) -> None:
        self.signals = tuple(signals)
        #: signal -> wall time of its first arrival. Written only by the handler.
        self.first_seen: dict[signal.Signals, float] = {}
        #: signal -> how many times it arrived.
        self.count: dict[signal.Signals, int] = {}
        self._previous: dict[signal.Signals, _Handler] = {}
        self.installed = False

    def install(self) -> bool:
        """Install the handlers; returns False (and changes nothing) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False  # signal.signal() raises ValueError there; the caller logs why
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return True

    def record(self, sig: signal.Signals, at: float) -> None:
        """``sig`` received elsewhere at wall time ``at`` (the batch shell's warning, passed on by ``slurmrt run``):
        recorded as if it had arrived here, when it is one of the signals recorded."""
        if sig in self.signals:
            self.first_seen.setdefault(sig, at)
            self.count[sig] = self.count.get(sig, 0) + 1

    def reclaim(self) -> list[signal.Signals]:
        """Put the recording handlers back where something replaced them since :meth:`install` (a framework's own
        SLURM handling); the handlers chained behind them stay the ones seen at install. Returns the signals taken
        back. Main thread only, like :meth:`install`."""
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return []
        taken = [sig for sig in self.signals if signal.getsignal(sig) != self._handle]
        for sig in taken:
            signal.signal(sig, self._handle)
        return taken

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.first_seen.setdefault(sig, _clock.wall())
        self.count[sig] = self.count.get(sig, 0) + 1
        previous = self._previous.get(sig)
        if sig is signal.SIGINT and self.count[sig] >= 2:
            # A second Ctrl-C means "now": the user gave up on a clean stop.
            raise KeyboardInterrupt
        # Chain a handler the user installed before us (but not Python's default SIGINT handler, which would raise
        # KeyboardInterrupt mid-step, nor SIG_DFL, which would kill the process before the checkpoint).
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)

    def close(self) -> None:
        if not self.installed:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, _after(sig, previous))
        self._previous.clear()
        self.installed = False


#: Signals slurmrt records that end a run rather than warn of its end: the processes it starts may see these.
_ENDING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def _after(sig: signal.Signals, previous: _Handler) -> _Handler:
    """The handler to leave once slurmrt is done: the one it found, except that a warning signal (USR1, USR2) whose
    default action is to die is ignored from then on. The warning of a job's end (``--signal``, a preemption) often
    comes while a finished process tears down (process groups, a tracker's flush): dying of it would turn a
    finished task into a failed one (srun: "User defined signal 1", exit 138), and there is nothing left to save."""
    if previous is None or previous == signal.SIG_DFL:
        return signal.SIG_DFL if sig in _ENDING else signal.SIG_IGN
    return previous


class ChildShield:
    """Keeps Slurm's warning signals (``--signal=USR1@N``, sent to every process of the step) from the processes
    this one starts: a multiprocessing Manager, the resource tracker, DataLoader workers, a framework's saver.

    Their default action for SIGUSR1 is to die; a warning that kills the helper a checkpoint needs fails the very
    save it asks for. A signal blocked in a thread stays blocked in what it forks and executes, so the main thread
    (where programs start their helpers) blocks the warning signals, and one idle thread, started before the block,
    keeps them unblocked: the kernel delivers them to it, and Python runs the recording handler in the main thread
    as usual. The ending signals (TERM, INT, HUP) are left alone: helpers end with the job.
    """

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.signals = tuple(s for s in signals if s not in _ENDING)
        self._previous: set[int | signal.Signals] | None = None
        self._stop = threading.Event()

    def install(self) -> bool:
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return False
        # Started before the block, so its mask leaves the signals open: it is where they arrive.
        threading.Thread(target=self._stop.wait, name="slurmrt-signal-receiver", daemon=True).start()
        self._previous = signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        return True

    def close(self) -> None:
        if self._previous is None:
            return
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)
        self._previous = None
        self._stop.set()
