"""``slurmrt run``'s word to the step it runs: the batch shell's warning signals and the job's times.

Slurm's warning (``--signal=B:USR1@120``) reaches the batch shell only. The supervisor's handler records it; this
thread writes it into the running step's word (:mod:`.word`), whose rank 0 reads it at its next poll and records it
as if it had arrived, and the agreement carries it to every rank. No process is signalled: a launcher (torchrun
dies of SIGUSR1) never sees it, no side step waits for the GPUs the step holds, and a training inside a container
(another ``/tmp``, perhaps other pids) gets it all the same. A signal that came between two steps goes to the next
one.

The job's start and end times are asked of Slurm here, outside any container, before each step and every
``refresh_s``: the step's deadline reads them from the word, and its ranks ask Slurm nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import _clock
from ..launch import hostlist
from ..stop.deadline import query_job_times
from .steps import Placement
from .word import Word, write_word

__all__ = ["Forwarder"]


@dataclass
class Forwarder:
    job: str
    #: The supervisor's directory, where the word goes.
    directory: Path
    say: Callable[[str], None]
    #: (start, end) of the job as Slurm says (``squeue``); either None when unknown.
    times: Callable[[str], tuple[float | None, float | None]] = query_job_times
    #: How often the job's times are asked again while a step runs (a limit changed with ``scontrol update``).
    refresh_s: float = 900.0
    #: Signals recorded with when they came, not yet passed on.
    pending: list[tuple[signal.Signals, float]] = field(default_factory=list)
    _wake: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _done: bool = False
    _step: tuple[int, Placement] | None = None
    _words: dict[int, Word] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slurmrt-forward", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)  # an squeue in flight finishes (bounded by its timeout)

    def add(self, sig: signal.Signals) -> None:
        """Record ``sig`` (from a signal handler: nothing more)."""
        self.pending.append((sig, _clock.wall()))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def running(self, attempt: int | None, placement: Placement | None = None) -> None:
        """Step ``attempt`` is about to start on ``placement`` (None: no step runs). Its word, with the job's times
        and any signal that came meanwhile, is written before it starts, so that its first read finds it."""
        self._step = (attempt, placement) if attempt is not None and placement is not None else None
        if self._step is not None:
            self._tell(*self._step, ask=True)

    def _run(self) -> None:
        while not self._done:
            asked = not self._wake.wait(timeout=self.refresh_s)  # woken by a signal, or it is time to ask again
            self._wake.clear()
            step = self._step
            if step is not None and not self._done:
                self._tell(*step, ask=asked)

    def _tell(self, attempt: int, placement: Placement, *, ask: bool) -> None:
        """Write step ``attempt``'s word: the job's times asked again when ``ask``, the pending signals added."""
        with self._lock:
            word = self._words.setdefault(attempt, Word())
            if ask:
                word.start, word.end = self.times(self.job)
            passed = []
            while self.pending:
                sig, at = self.pending.pop(0)
                if sig.name not in word.signals:  # the same signal twice before it was read: once is enough
                    word.signals[sig.name] = at
                    passed.append(sig.name)
            try:
                write_word(self.directory, attempt, word)
            except OSError as err:
                self.say(f"cannot write the step's word in {self.directory}: {err}; "
                         f"{', '.join(passed) or 'the job end time'} not passed on")
                return
        for name in passed:
            self.say(f"{name}: passed to the training processes on {hostlist.compress(placement.nodes)}")
