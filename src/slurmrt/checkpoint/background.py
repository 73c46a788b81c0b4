"""Background saves: the two-part save function that may run there, and a save in flight as a value.

A background save runs on the ``slurmrt-save`` thread; its result (or its error) is a :class:`PendingSave` the
training thread takes when it is ready. Nothing the save learns is pushed anywhere.

Its write runs at a lower CPU priority than training (nice +:data:`NICE`, Linux, where the nice value is each
thread's own): on a thread of its own, ``slurmrt-save-write``, whose priority the threads it starts inherit, and
which hands the tensors to the save helper process (:mod:`.helper`), started at the same lowered priority. The
commit, on ``slurmrt-save``, runs at the training's priority, and so does any long-lived thread it starts (a log
writer): a thread cannot raise its priority again. A save's writers are several threads of serialization, hashing
and copies into the page cache: at the training's priority they take the cores from a busy-Python training loop; at
a lower one, as threads of the training process, a low-priority thread that holds the GIL and is preempted still
keeps the training thread waiting; in the helper process, which has a GIL of its own, far less
(``benchmarks/RESULTS.md``, "Checkpoint write and resume").
Whenever the training thread waits for the save (the next save, the stop, ``wait()``), it leaves the cores to it,
and the save runs at full speed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .._errors import CheckpointError

__all__ = ["NICE", "PendingSave", "SaveResult", "Staged", "lower_priority", "run_below_training"]

_T = TypeVar("_T")

#: How much lower than the training's the CPU priority of a background save's write is, by default (a nice
#: increment; option ``save_nice``).
NICE = 10


@dataclass(frozen=True)
class Staged:
    """A save function in two parts, the form a function takes for ``blocking=False``: ``snapshot()`` runs on the
    training thread (it may use collectives, and copies what training will change), then ``write(snapshot,
    directory)`` runs on the background thread and must issue no collective (it would pair up with the training
    thread's). A plain function is refused for background saves: a framework saver's own collectives would."""

    snapshot: Callable[[], Any]
    write: Callable[[Any, Path], Any]


@dataclass(frozen=True)
class SaveResult:
    step: int
    path: Path
    seconds: float
    bytes: int
    #: Wall time the save began.
    started: float
    #: The step was committed by this run already (a periodic save, then the stop at that step): that one is kept.
    kept: bool = False
    #: Seconds the save held the training (its call, a wait for the save before it included); a background save's
    #: write goes on after it. None where it was not measured.
    stall: float | None = None


class PendingSave:
    """A save running on the ``slurmrt-save`` thread: its result (or error) is a value the caller takes with
    :meth:`wait`, on its own thread; nothing it learns is pushed anywhere."""

    def __init__(self, save: Callable[[], SaveResult]) -> None:
        self._save = save
        self._result: SaveResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slurmrt-save", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._save()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread by wait()
            self._error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> SaveResult:
        """Join the save; its result, or its error raised here. Calling it again gives the same answer."""
        self._thread.join()
        if self._error is not None:
            if isinstance(self._error, CheckpointError):
                raise self._error
            raise CheckpointError(f"background checkpoint save failed: {self._error!r}") from self._error
        assert self._result is not None
        return self._result


def run_below_training(work: Callable[[], _T], nice: int = NICE) -> _T:
    """``work()`` on a new thread ``nice`` below this one's priority (with every thread it starts); its value, or
    its error raised here."""
    out: list[_T] = []
    error: list[BaseException] = []

    def run() -> None:
        lower_priority(nice)
        try:
            out.append(work())
        except BaseException as err:  # noqa: BLE001 - raised on the calling thread below
            error.append(err)

    thread = threading.Thread(target=run, name="slurmrt-save-write", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return out[0]


def lower_priority(increment: int) -> None:
    """This thread's nice value raised by ``increment`` (its CPU priority lowered), and so that of every thread it
    starts. Linux only (elsewhere the nice value is the whole process's, and training's must not drop); a refusal
    (a seccomp filter) leaves the priority as it was."""
    if not sys.platform.startswith("linux") or increment <= 0:
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
