"""torch's C++ warnings, hushed while slurmrt asks the rendezvous store something it answers for itself.

A request to a store whose host has gone (rank 0 answered a hang and exited; a frozen rank woke after it) fails in
torch's C++ client, which logs the failure at W level with a stack of about 20 frames before it raises. slurmrt
catches the error and says what it means in one line, so the stack only buries that line. torch reads
``TORCH_CPP_LOG_LEVEL`` once, when it loads; the threshold it sets is c10's ``FLAGS_caffe2_log_level``, checked at
every message, so slurmrt raises it to ERROR for the length of its own requests and puts it back after. A request
that never returns (the store's host is stopped) leaves it raised: that process is about to answer a hang.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["hushed"]

#: c10's severities: INFO 0, WARNING 1, ERROR 2, FATAL 3.
_ERROR = 2

_lock = threading.Lock()
_depth = 0
_saved = 0
_level: ctypes.c_int | None = None
_looked = False


def _threshold() -> ctypes.c_int | None:
    """c10's log threshold, once torch is loaded (None before, or where the library does not export it)."""
    global _level, _looked
    if not _looked and "torch" in sys.modules:
        _looked = True
        where = getattr(sys.modules["torch"], "__file__", None)
        if not where:  # never a relative path: a library planted in the working directory is not loaded
            return None
        for lib in sorted(Path(where).parent.joinpath("lib").glob("libc10.*")):
            with contextlib.suppress(OSError, ValueError):
                _level = ctypes.c_int.in_dll(ctypes.CDLL(str(lib)), "FLAGS_caffe2_log_level")
                break
    return _level


@contextlib.contextmanager
def hushed() -> Iterator[None]:
    """torch's C++ log shows only errors inside the block (every thread's: the threshold is the process's). Nested
    and concurrent blocks share one raise: the last to leave puts the threshold back."""
    global _depth, _saved
    with _lock:
        level = _threshold()
        if level is not None:
            if _depth == 0:
                _saved = level.value
                level.value = max(_saved, _ERROR)
            _depth += 1
    try:
        yield
    finally:
        if level is not None:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    level.value = _saved
