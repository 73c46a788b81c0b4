"""Log lines that never interleave across ranks and nodes: each record is written whole under an exclusive flock.

Which lock file: when writing to a file, the file itself (every writer of that file sees it, and on a shared
filesystem so does every node). When writing to a stream (stdout under srun), a lock file beside the job's output:
``$SLURM_SUBMIT_DIR/.slurmrt-<job id>.lock`` -- the submit directory is where sbatch puts the job's output by
default, so it is a filesystem every node of the job can reach. Outside SLURM, a file in this user's private
runtime directory (one machine). ``SLURMRT_LOCK_FILE`` overrides both.

No other user can make a log line wait: a lock file that is a symlink or another user's is not used, and a lock held
for more than ``LOCK_TIMEOUT_S`` is given up (with one warning on stderr); the lines are then written unlocked.

On NFS, Linux implements flock with byte-range locks that work
across clients; Lustre needs the ``flock`` mount option.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ._safefs import runtime_base

__all__ = ["FlockHandler", "default_lock_path", "install", "printflock"]

_lock_fds: dict[str, int | None] = {}
_private_lock: dict[tuple[str | None, str | None], Path] = {}
#: The longest wait for the lock before a line is written without it.
LOCK_TIMEOUT_S = 10.0
_lock_guard = threading.Lock()  # flock is per open file description: threads of one process share it


def default_lock_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("SLURMRT_LOCK_FILE"):
        return Path(env["SLURMRT_LOCK_FILE"])
    job = env.get("SLURM_JOB_ID")
    if job and env.get("SLURM_SUBMIT_DIR"):
        return Path(env["SLURM_SUBMIT_DIR"]) / f".slurmrt-{job}.lock"
    # This user's private directory, not a fixed name in /tmp: another user who created that file first and held a
    # lock on it blocked every job's log line forever. Checked once per process (a mkdir and an lstat), not per line.
    key = (env.get("XDG_RUNTIME_DIR"), env.get("TMPDIR"))
    if key not in _private_lock:
        _private_lock[key] = runtime_base(env) / "log.lock"
    return _private_lock[key]


def _prefix(env: Mapping[str, str] | None = None) -> str:
    """``[host:rank]``. Of the process's own environment it is computed once (three lookups and a system call
    cost more than the rest of a line) and again after :func:`forget_prefix`, which init() calls once it has
    exported RANK."""
    global _own_prefix
    if env is None and _own_prefix is not None:
        return _own_prefix
    values = os.environ if env is None else env
    host = values.get("SLURMD_NODENAME") or socket.gethostname()
    rank = values.get("RANK") or values.get("SLURM_PROCID") or "0"
    prefix = f"[{host}:{rank}]"
    if env is None:
        _own_prefix = prefix
    return prefix


_own_prefix: str | None = None


def forget_prefix() -> None:
    """The environment's host or rank changed (init() exported RANK): the next line computes its prefix again."""
    global _own_prefix
    _own_prefix = None


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


class _Writer:
    """Writes the lines of a contended lock on a thread of its own, blocked in ``flock``: woken the moment the lock
    is free, it holds it only for the write and the flush. The caller waits for it at most the timeout, then writes
    unlocked. Measured with 8 writers on 2 cores: a poll with sleeps left the lock idle between holders, and handing
    the lock (not the write) back to the caller held it across two context switches; both reached a quarter of a raw
    flock's rate. flock belongs to the open file description: this thread's lock is the process's."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        threading.Thread(target=self._run, name="slurmrt-log-lock", daemon=True).start()

    def write(self, text: str | bytes, stream: IO[str] | int, timeout_s: float) -> bool:
        """True once ``text`` is written under the lock; False when the lock stayed taken for ``timeout_s`` (the
        line is then not written here)."""
        job = _Job(text, stream)
        with self._cond:
            self._jobs.append(job)
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: job.state == "done", timeout_s):
                if job.state == "queued":
                    job.state = "abandoned"  # released unwritten if the thread ever gets the lock for it
                    return False
                self._cond.wait_for(lambda: job.state == "done")  # being written: a matter of microseconds
        if job.error is not None:
            raise job.error
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                job = self._jobs.pop(0)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            with self._cond:
                taken = job.state == "queued"
                job.state = "writing" if taken else job.state
            try:
                if taken:
                    _write(job.text, job.stream)
            except Exception as err:  # noqa: BLE001 - the caller raises it
                job.error = err
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            if taken:
                with self._cond:
                    job.state = "done"
                    self._cond.notify_all()


class _Job:
    __slots__ = ("error", "state", "stream", "text")

    def __init__(self, text: str | bytes, stream: IO[str] | int) -> None:
        self.text, self.stream = text, stream
        self.state = "queued"  # then "writing" and "done", or "abandoned"
        self.error: Exception | None = None


_writers: dict[int, _Writer] = {}


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) opens its own lock file description: flock belongs to the description,
    so one inherited from the parent would not keep the two apart; the parent's waiter threads are not in the
    child, and a guard held by one of its threads at the fork would never be released."""
    global _lock_guard
    for fd in _lock_fds.values():
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _lock_fds.clear()
    _writers.clear()
    _lock_guard = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def write_locked(text: str | bytes, stream: IO[str] | int, lock_path: Path) -> None:
    """Write ``text`` to ``stream`` (a text stream, or a descriptor opened with O_APPEND) and flush it while holding
    an exclusive flock on ``lock_path``. The lock is waited for at most LOCK_TIMEOUT_S (a line takes microseconds; a
    longer hold is a stuck or foreign process), then the line is written anyway: a log line never blocks training."""
    with _lock_guard:
        fd = _lock_fds[key] if (key := str(lock_path)) in _lock_fds else _fd_for(lock_path)
        if fd is None:
            _write(text, stream)
            return
        try:
            fcntl.flock(fd, _EX_NB)
        except BlockingIOError:
            if not _retry(fd):  # contended: the fd's writer thread waits for the lock and writes the line
                _hand_over(text, stream, fd, key)
                return
        try:
            _write(text, stream)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _hand_over(text: str | bytes, stream: IO[str] | int, fd: int, key: str) -> None:
    writer = _writers.get(fd)
    if writer is None:
        writer = _writers[fd] = _Writer(fd)
    if writer.write(text, stream, LOCK_TIMEOUT_S):
        return
    _lock_fds[key] = None  # held for seconds: not by a writer of ours; stop waiting for it
    _warn(f"the log lock {key} stayed locked for {LOCK_TIMEOUT_S:.0f} s: log lines are written without it from now "
          "on")
    _write(text, stream)


_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB
#: Times a contended lock is tried again, yielding the CPU before each, before the writer thread takes the line.
YIELDS = 32


def _retry(fd: int) -> bool:
    """The lock was held: yield the CPU and try again, a few times. Its holder is a line away from letting go; on a
    machine with more busy processes than cores it is often waiting for a core, which ``sched_yield`` gives it.
    Handing the line to the writer thread instead costs two thread switches (measured with 8 writers on 2 cores:
    0.24-0.33 of a raw flock's rate without the retries, 0.28-0.41 with 8 to 64)."""
    for _ in range(YIELDS):
        os.sched_yield()
        try:
            fcntl.flock(fd, _EX_NB)
            return True
        except BlockingIOError:
            continue
    return False


def _write(text: str | bytes, stream: IO[str] | int) -> None:
    if isinstance(stream, int):  # a file of the handler's own, O_APPEND: the bytes in one system call
        view = memoryview(text if isinstance(text, bytes) else text.encode())
        while view:
            view = view[os.write(stream, view):]
        return
    stream.write(text if isinstance(text, str) else text.decode())
    stream.flush()


def printflock(*args: Any, sep: str = " ", file: IO[str] | None = None, lock_path: str | Path | None = None) -> None:
    """``print(*args)`` prefixed with ``[host:rank]``, written whole under the job's flock."""
    text = sep.join(str(a) for a in args)
    prefix = _prefix()
    body = "".join(f"{prefix} {line}\n" for line in text.split("\n"))
    write_locked(body, file or sys.stdout, Path(lock_path) if lock_path else default_lock_path())


class FlockHandler(logging.Handler):
    """A handler that writes each record whole, prefixed with host and rank, under an exclusive flock.

    With ``path``, appends to that file and locks the file itself; otherwise writes to ``stream`` (stdout by default)
    and locks :func:`default_lock_path`.
    """

    def __init__(self, stream: IO[str] | None = None, *, path: str | Path | None = None,
                 lock_path: str | Path | None = None, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._path = Path(path) if path is not None else None
        self._stream = stream
        self._fd: int | None = None
        if self._path is not None:
            self._lock_path = Path(lock_path) if lock_path else self._path
        else:
            self._lock_path = Path(lock_path) if lock_path else default_lock_path()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix, text = _prefix(), self.format(record)
            body = f"{prefix} {text}\n" if "\n" not in text else "".join(f"{prefix} {line}\n" for line in
                                                                          text.split("\n"))
            if self._path is None:
                write_locked(body, self._stream or sys.stdout, self._lock_path)
                return
            if self._fd is None:
                # O_APPEND: every write lands at the current end even when another node appended meanwhile. The
                # line goes out in one write() of bytes encoded before the lock is taken: the lock is held for
                # that system call alone.
                self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            write_locked(body.encode("utf-8", "backslashreplace"), self._fd, self._lock_path)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        super().close()


def install(level: int | str = logging.INFO, *, stream: IO[str] | None = None, path: str | Path | None = None,
            logger: logging.Logger | None = None) -> FlockHandler:
    """Attach a :class:`FlockHandler` to ``logger`` (the root logger by default) and return it.

    Only the handler gets ``level``; the logger's own level is lowered to it if needed, never raised.
    """
    handler = FlockHandler(stream, path=path, level=logging.getLevelName(level) if isinstance(level, str) else level)
    target = logger or logging.getLogger()
    target.addHandler(handler)
    if target.level == logging.NOTSET or target.level > handler.level:
        target.setLevel(handler.level)
    return handler
