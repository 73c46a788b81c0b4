"""Where a failing rank's stacks and traceback go: a file of its own beside the event log, named in one log line, so
that a recovery reads as a few lines in the job's output instead of every rank's thread stacks.

``stacks-<job>-<restart>.<attempt>-rank<R>.txt`` in the event log's directory (the checkpoint directory by default).
Without an event log, or when the file cannot be written, the stacks go to the log as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from .._safefs import open_append
from ..launch.topology import Topology
from ..recovery.report import stacks_path, stacks_pattern

__all__ = ["pattern", "quiet_peer_tracebacks", "stacks_file", "write"]


def stacks_file(events_path: Path | None, t: Topology) -> Path | None:
    """This rank's stacks file for this run and step, or None without an event log."""
    return stacks_path(events_path, t.requeue_id, t.restart_count, t.attempt, t.rank)


def pattern(events_path: Path | None, t: Topology) -> str | None:
    """Every rank's stacks files of this run and step, as a glob a user can type."""
    return stacks_pattern(events_path, t.requeue_id, t.restart_count, t.attempt)


def write(path: Path | None, title: str, text: str) -> bool:
    """Append ``text`` under ``title`` to ``path``; False when there is no such file or it cannot be written (the
    caller logs the text instead)."""
    if path is None:
        return False
    try:
        fd = open_append(path, 0o640)
    except OSError:
        return False
    try:
        os.write(fd, f"== {title}\n{text.rstrip()}\n\n".encode("utf-8", "backslashreplace"))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def quiet_peer_tracebacks(path: Path | None, is_peer_failure: Callable[[BaseException], bool],
                          say: Callable[[str], None]) -> None:
    """Wrap ``sys.excepthook`` (torch's, which prefixes ``[rankN]:``, or Python's): an uncaught exception that says a
    peer was lost (this rank is a victim; slurmrt names the lost one and recovers) goes to ``path`` with one line
    said in its place. Every other exception is printed as before. Call it after ``init_process_group``, which
    installs torch's hook over whatever was there."""
    if path is None or getattr(sys.excepthook, "_slurmrt", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            if is_peer_failure(value) and write(path, "uncaught exception",
                                                "".join(traceback.format_exception(kind, value, tb))):
                say(f"the training raised {kind.__name__} (a peer was lost): its traceback is in {path}")
                return
        previous(kind, value, tb)

    hook._slurmrt = True  # type: ignore[attr-defined]
    sys.excepthook = hook
