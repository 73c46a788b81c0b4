"""Background saves: the two-part save function that may run there, and a save in flight as a value.

A background save runs on the ``slurmrt-save`` thread; its result (or its error) is a :class:`PendingSave` the
training thread takes when it is ready. Nothing the save learns is pushed anywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import CheckpointError

__all__ = ["PendingSave", "SaveResult", "Staged"]


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
