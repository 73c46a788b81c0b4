"""The lock under which :mod:`slurmrt.log` writes a line: its file's descriptor (one per process, refused when
another user owns it or it is a symlink), the queue of lines that found it taken and the thread that writes them as
soon as it is free, the give-up after ``LOCK_TIMEOUT_S``, and the flush at exit and after a fork. What a line says
and where it goes is :mod:`slurmrt.log`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

__all__ = ["LOCK_TIMEOUT_S", "flush", "write_locked"]

_lock_fds: dict[str, int | None] = {}
#: The longest wait for the lock before a line is written without it.
LOCK_TIMEOUT_S = 10.0
_lock_guard = threading.Lock()  # flock is per open file description: threads of one process share it
_monotonic = time.monotonic


def _fd_for(path: Path) -> int | None:
    """The lock file's descriptor (opened once per process); None when it cannot be used: a symlink, or a file
    another user owns (they could hold its lock forever). Lines are then written unlocked, with one warning."""
    key = str(path)
    if key in _lock_fds:
        return _lock_fds[key]
    fd: int | None = None
    try:
        fd = os.open(key, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
        owner = os.fstat(fd).st_uid
        if owner != os.getuid():
            os.close(fd)
            fd = None
            _warn(f"the log lock {path} belongs to uid {owner}, not to this user: log lines are written without "
                  "it (set SLURMRT_LOCK_FILE to a file of yours)")
    except OSError as err:
        _warn(f"cannot use the log lock {path} ({err}): log lines are written without it (set SLURMRT_LOCK_FILE)")
    _lock_fds[key] = fd
    return fd


def _warn(message: str) -> None:
    sys.stderr.write(f"slurmrt.log: {message}\n")  # not through logging: this module may be logging's handler


class _Queue:
    """The lines that found the lock taken, written in order by a thread of their own: blocked in ``flock``, it is
    woken the moment the lock is free and writes every line waiting by then, one write per stream, under one hold of
    the lock. The caller does not wait: a log line never holds up a training step, whoever holds the lock.

    While lines wait here, the process's next lines join them (its lines stay in order). A line that waited more
    than ``LOCK_TIMEOUT_S`` means the lock is held by something that is not a writer of lines (a stuck or foreign
    process): the next line, or :func:`flush`, gives the lock up and writes what waits without it. flock belongs to
    the open file description, so this thread's lock is the process's."""

    def __init__(self, fd: int, key: str) -> None:
        self._fd, self._key = fd, key
        self._cond = threading.Condition()
        #: (text, stream, when queued); a line leaves the list once written (or given up).
        self._lines: list[tuple[str | bytes, IO[str] | int, float]] = []
        self._writing = False  # the thread holds the lock and writes lines taken from the list
        self._given_up = False
        threading.Thread(target=self._run, name="slurmrt-log-lock", daemon=True).start()

    def waiting(self) -> bool:
        """Lines wait or are being written: the caller's line goes after them. (flock belongs to the open file
        description, which the process's threads share: only this keeps a caller from writing beside the thread.)"""
        with self._cond:
            return bool(self._lines) or self._writing

    def put(self, text: str | bytes, stream: IO[str] | int) -> None:
        now = _monotonic()
        with self._cond:
            given_up = self._given_up
            if not given_up:
                self._lines.append((text, stream, now))
                if len(self._lines) == 1:
                    self._cond.notify_all()  # the thread waits only for a first line
            stale = not given_up and now - self._lines[0][2] > LOCK_TIMEOUT_S
        if given_up:  # given up since the caller looked the lock up: nothing would write the line
            _write(text, stream)
        elif stale:
            self.give_up(f"stayed locked for {LOCK_TIMEOUT_S:g} s")

    def flush(self, timeout_s: float) -> None:
        """Wait until every waiting line is written; after ``timeout_s``, give the lock up and write them without it."""
        with self._cond:
            if self._cond.wait_for(lambda: not self._lines and not self._writing, timeout_s):
                return
        self.give_up(f"stayed locked for {timeout_s:g} s")

    def give_up(self, why: str) -> None:
        with self._cond:
            if self._given_up:
                return
            self._given_up = True
            lines, self._lines = self._lines, []
            self._cond.notify_all()
        _lock_fds[self._key] = None  # not waited for again by this process
        _warn(f"the log lock {self._key} {why}: log lines are written without it from now on")
        _write_all(lines)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._lines) or self._given_up)
                if self._given_up:
                    return
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks until the lock is free: no polling, no sleeps
            except OSError as err:  # the descriptor is gone: the lines are not left to wait for the timeout
                self.give_up(f"cannot be taken ({err})")
                return
            try:
                with self._cond:
                    lines, self._lines = self._lines, []  # given up meanwhile: nothing left to write
                    self._writing = True
                _write_all(lines)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()


def _write_all(lines: list[tuple[str | bytes, IO[str] | int, float]]) -> None:
    """Write queued lines in order, the consecutive ones to one stream in one write. A failure is reported on
    stderr (the callers have moved on)."""
    # Shape: one pass over the queue, a run of lines per stream; the two encodings are one write, kept together
    i = 0
    while i < len(lines):
        stream = lines[i][1]
        j = i
        while j < len(lines) and lines[j][1] is stream:
            j += 1
        parts = [text for text, _, _ in lines[i:j]]
        try:
            _write(b"".join(p if isinstance(p, bytes) else p.encode() for p in parts) if isinstance(stream, int)
                   else "".join(p if isinstance(p, str) else p.decode() for p in parts), stream)
        except Exception as err:  # noqa: BLE001 - no caller to raise it to
            _warn(f"{j - i} log line(s) could not be written: {err!r}")
        i = j


_queues: dict[str, _Queue] = {}  # by lock file


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) opens its own lock file description: flock belongs to the description,
    so one inherited from the parent would not keep the two apart; the parent's queue threads are not in the
    child (the lines waiting there are the parent's to write), and a guard held by one of its threads at the fork
    would never be released."""
    global _lock_guard
    for fd in _lock_fds.values():
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _lock_fds.clear()
    _queues.clear()
    _lock_guard = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def write_locked(text: str | bytes, stream: IO[str] | int, lock_path: Path) -> None:
    """Write ``text`` to ``stream`` (a text stream, or a descriptor opened with O_APPEND) and flush it while holding
    an exclusive flock on ``lock_path``. To a descriptor (the handler's own file), the line joins the lock's queue
    (:class:`_Queue`), written behind. To a text stream, the line is written now, on the caller's thread, when the
    lock is free, and joins the queue when it is taken. The call then returns at once when the stream lives as long
    as the process (stdout, stderr) or is the handler's own descriptor (closed only after a :func:`flush`): a log
    line never blocks training. Another stream (a file the caller may close next) is waited for, ``LOCK_TIMEOUT_S``
    at most. :func:`flush` waits for the queued lines."""
    waits = not (isinstance(stream, int) or stream is sys.stdout or stream is sys.stderr)
    queue = _put_locked(text, stream, lock_path, waits)
    if queue is not None and waits:
        queue.flush(LOCK_TIMEOUT_S)


def _put_locked(text: str | bytes, stream: IO[str] | int, lock_path: Path, waits: bool) -> _Queue | None:
    """Write now, or queue (a descriptor's line always): the queue the line joined, if any. A line that will be
    waited for tries the taken lock again a few times first (:func:`_retry`)."""
    # Shape: the lock protocol in its order (no lock file, join a queue, try the lock, write, unlock), in one place
    with _lock_guard:
        fd = _lock_fds[key] if (key := str(lock_path)) in _lock_fds else _fd_for(lock_path)
        if fd is None:
            _write(text, stream)
            return None
        queue = _queues.get(key)
        if isinstance(stream, int) or (queue is not None and queue.waiting()):  # behind, or after the lines before
            if queue is None:
                queue = _queues[key] = _Queue(fd, key)
            queue.put(text, stream)
            return queue
        try:
            fcntl.flock(fd, _EX_NB)
        except BlockingIOError:
            if not (waits and _retry(fd)):
                if queue is None:
                    queue = _queues[key] = _Queue(fd, key)
                queue.put(text, stream)
                return queue
        try:
            _write(text, stream)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return None


#: Times a contended lock is tried again, yielding the CPU before each, before a line that will be waited for joins
#: the queue.
YIELDS = 32


def _retry(fd: int) -> bool:
    """The lock was held: yield the CPU and try again, a few times. Its holder is a line away from letting go; on a
    machine with more busy processes than cores it is often waiting for a core, which ``sched_yield`` gives it. The
    queue's thread instead costs two thread switches per line when the caller waits for it (measured with 8 writers
    to one file on 2 cores: 0.24-0.33 of a raw flock's rate without the retries, 0.28-0.41 with 8 to 64)."""
    for _ in range(YIELDS):
        os.sched_yield()
        try:
            fcntl.flock(fd, _EX_NB)
            return True
        except BlockingIOError:
            continue
    return False


def flush(timeout_s: float | None = None) -> None:
    """Wait until the lines queued behind a taken lock are written: at most ``timeout_s`` (``LOCK_TIMEOUT_S`` by
    default), then they are written without the lock. Called at exit, by ``logging.shutdown()`` (the handler's
    ``flush``) and before slurmrt ends a process with ``os._exit``."""
    for queue in list(_queues.values()):
        queue.flush(LOCK_TIMEOUT_S if timeout_s is None else timeout_s)


atexit.register(flush)


_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB


def _write(text: str | bytes, stream: IO[str] | int) -> None:
    if isinstance(stream, int):  # a file of the handler's own, O_APPEND: the bytes in one system call
        view = memoryview(text if isinstance(text, bytes) else text.encode())
        while view:
            view = view[os.write(stream, view):]
        return
    stream.write(text if isinstance(text, str) else text.decode())
    stream.flush()
