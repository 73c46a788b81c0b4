"""Log lines that never interleave across ranks and nodes: each record is written whole under an exclusive flock.

Which lock file: when writing to a file, the file itself (every writer of that file sees it, and on a shared
filesystem so does every node). When writing to a stream (stdout under srun), a lock file beside the job's output:
``$SLURM_SUBMIT_DIR/.slurmrt-<job id>.lock`` -- the submit directory is where sbatch puts the job's output by
default, so it is a filesystem every node of the job can reach. Outside SLURM, a file in this user's private
runtime directory (one machine). ``SLURMRT_LOCK_FILE`` overrides both.

A line never waits for the lock. To a stream (stdout, shared with the program's ``print``), a line is written at once
when the lock is free; when it is taken the line is queued. To the handler's own file, every line is queued: the
file is the handler's alone, so writing it behind changes no order. A thread of the process writes all the queued
lines as soon as the lock is free, in one hold of it and one write, in order (flushed at exit, by
``logging.shutdown()`` and before slurmrt's own exits; rates in benchmarks/RESULTS.md, "Logging under contention").
A process killed by SIGKILL loses the lines logged since the lock's thread last ran (milliseconds).

No other user can make a log line wait: a lock file that is a symlink or another user's is not used, and a lock held
for more than ``LOCK_TIMEOUT_S`` is given up (with one warning on stderr); the lines are then written unlocked.

The lock itself (its descriptor, the queue, the give-up) is :mod:`slurmrt._flock`.

On NFS, Linux implements flock with byte-range locks that work across clients; Lustre needs the ``flock`` mount
option.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, NoReturn

from ._flock import flush, write_locked
from ._safefs import runtime_base
from .launch import slurmvars

__all__ = ["FlockHandler", "default_lock_path", "exit_now", "flush", "install", "printflock"]

_private_lock: dict[tuple[str | None, str | None], Path] = {}


def default_lock_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("SLURMRT_LOCK_FILE"):
        return Path(env["SLURMRT_LOCK_FILE"])
    job, submitted = slurmvars.job_id(env), slurmvars.submit_dir(env)
    if job and submitted:
        return Path(submitted) / f".slurmrt-{job}.lock"
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
    host = slurmvars.node_name(values) or socket.gethostname()
    rank = values.get("RANK") or slurmvars.proc_id(values) or "0"
    prefix = f"[{host}:{rank}]"
    if env is None:
        _own_prefix = prefix
    return prefix


_own_prefix: str | None = None


def forget_prefix() -> None:
    """The environment's host or rank changed (init() exported RANK): the next line computes its prefix again."""
    global _own_prefix
    _own_prefix = None



def exit_now(code: int) -> NoReturn:
    """Flush what the logs hold and end the process at once (``os._exit``, which runs no atexit handler): a stuck
    thread cannot be joined, and gloo's teardown under failed collectives would abort the process instead of
    letting it exit with ``code``."""
    flush()  # the lines queued behind a taken log lock
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(int(code))
def printflock(*args: Any, sep: str = " ", file: IO[str] | None = None, lock_path: str | Path | None = None) -> None:
    """``print(*args)`` prefixed with ``[host:rank]``, written whole under the job's flock."""
    text = sep.join(str(a) for a in args)
    prefix = _prefix()
    body = "".join(f"{prefix} {line}\n" for line in text.split("\n"))
    write_locked(body, file or sys.stdout, Path(lock_path) if lock_path else default_lock_path())


class FlockHandler(logging.Handler):
    """A handler that writes each record whole, prefixed with host and rank, under an exclusive flock.

    With ``path``, appends to that file and locks the file itself, the lines written behind by the lock's thread;
    otherwise writes to ``stream`` (stdout by default) and locks :func:`default_lock_path`. :meth:`flush` (and
    ``logging.shutdown()`` at exit) waits for the lines not written yet.
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

    def flush(self) -> None:
        """Wait for this process's lines queued behind a taken lock (``logging.shutdown()`` calls it at exit)."""
        flush()

    def close(self) -> None:
        if self._fd is not None:
            flush()  # its lines queued behind a taken lock, before their descriptor goes
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
