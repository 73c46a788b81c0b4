"""Progress of a long save or load, said by rank 0: bytes so far, of how many when known, the rate and the time
left. Nothing for a save or load done within ``AFTER_S``; then a line every ``EVERY_TTY_S`` on a terminal, every
``EVERY_S`` otherwise (a job's output file is read later: a line every few seconds of a one-hour load is noise).

What is counted: a save, the files appearing under its temporary directories in the checkpoint directory (every
rank's, on a shared filesystem; its total is the previous checkpoint's size, when there was one); a load, the bytes
this process has read (``/proc/self/io``, rank 0's own share; its total is the checkpoint's size over the ranks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["AFTER_S", "EVERY_S", "EVERY_TTY_S", "line", "loaded_bytes", "reporting", "saved_bytes"]

logger = logging.getLogger(__name__)

#: A save or load quicker than this says nothing of its progress.
AFTER_S = 5.0
#: Between two lines, on a terminal, and otherwise.
EVERY_TTY_S = 5.0
EVERY_S = 30.0


def size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def line(what: str, done: int, total: int | None, elapsed_s: float) -> str:
    """One progress line: ``saving step 500: 12.3 GB of 40.0 GB (31 %), 1.2 GB/s, about 23 s left``."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    text = f"{what}: {size(done)}"
    if total:
        text += f" of {size(total)} ({min(100, 100 * done // total)} %)"
    text += f", {size(rate)}/s, {elapsed_s:.0f} s so far"
    if total and rate > 0 and done < total:
        text += f", about {(total - done) / rate:.0f} s left"
    return text


def saved_bytes(directory: Path, step: int) -> Callable[[], int]:
    """The bytes written so far into step ``step``'s temporary directories (regular files; links not followed)."""
    prefix = f".tmp-step_{step:09d}-"

    def count() -> int:
        total = 0
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
                    total += _tree_bytes(Path(entry.path))
        return total

    return count


def _tree_bytes(root: Path) -> int:
    total = 0
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    total += _tree_bytes(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def loaded_bytes() -> Callable[[], int]:
    """The bytes this process has read since the call (``rchar`` of /proc/self/io; 0 where there is none)."""
    start = _rchar()
    return lambda: max(0, _rchar() - start)


def _rchar() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/io") as f:
        for row in f:
            if row.startswith("rchar:"):
                return int(row.split()[1])
    return 0


@contextlib.contextmanager
def reporting(what: str, done: Callable[[], int], total: int | None, *, enabled: bool = True) -> Iterator[None]:
    """Say the progress of the work inside the block, from a thread of its own (see the module's docstring)."""
    if not enabled:
        yield
        return
    finished = threading.Event()
    every = EVERY_TTY_S if sys.stderr.isatty() else EVERY_S
    start = time.monotonic()

    def run() -> None:
        wait = AFTER_S
        while not finished.wait(wait):
            with contextlib.suppress(Exception):  # a progress line never fails the save
                logger.info("%s", line(what, done(), total, time.monotonic() - start))
            wait = every

    thread = threading.Thread(target=run, name="slurmrt-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()
