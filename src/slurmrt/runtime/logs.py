"""slurmrt's own log lines in a job: the handler init() gives them, and the lock file that goes when the job ends."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import Mapping

from ..launch.slurmvars import job_id, submit_dir
from ..log import FlockHandler, default_lock_path, flush

__all__ = ["install_default", "remove_job_lock"]

#: The format of slurmrt's own lines (after ``[host:rank]``): when, how grave, and that slurmrt says it.
DEFAULT_FORMAT = "%(asctime)s %(levelname)s slurmrt: %(message)s"
DEFAULT_DATEFMT = "%Y-%m-%d %H:%M:%S"


def install_default(rank: int, *, wanted: bool = True) -> FlockHandler | None:
    """Give the ``slurmrt`` logger a :class:`FlockHandler` on stderr (init() calls it): INFO on rank 0, warnings on
    the other ranks (N ranks repeating rank 0's news is noise). It does not propagate to the root logger, which it
    leaves alone.

    Nothing is installed, and None returned, when the program configured logging before init(): the root logger
    or ``slurmrt`` has a handler (its lines then go where the program sends them), or the default is already in
    place (a second init() in one process), or the option ``log_handler`` is off. A level the program set on
    ``slurmrt`` is kept."""
    own = logging.getLogger("slurmrt")
    if not wanted or own.handlers or logging.getLogger().handlers:
        return None
    handler = FlockHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(DEFAULT_FORMAT, DEFAULT_DATEFMT))
    own.addHandler(handler)
    own.propagate = False
    if own.level == logging.NOTSET:
        own.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    return handler


def remove_job_lock(env: Mapping[str, str] | None = None) -> None:
    """The job finished for good: its lock file in the submit directory goes (a requeued run, which has the same job
    id, would have used it again). Only that default file, only when it is this user's regular file. A process
    still writing holds its descriptor, so its last lines stay whole; a later step of the job makes a new file."""
    env = os.environ if env is None else env
    if env.get("SLURMRT_LOCK_FILE") or not (job_id(env) and submit_dir(env)):
        return
    path = default_lock_path(env)
    flush()
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            os.unlink(path)
