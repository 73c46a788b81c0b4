"""Each training process registers its pid in a node-local directory per job, for `slurmrt signal`.

Launchers (torchrun, `accelerate launch`) die of SIGUSR1, so a `--signal=B:USR1` warning must be passed to the
training processes only; a command-line pattern (pkill -f) also matches the launcher, whose arguments name the script.

The directory is this user's private runtime directory (:func:`slurmrt._safefs.runtime_base`), never one another
user could have created first. A pid file holds the pid, the process's start time and the job id: a pid alone is
reused by the kernel (a SIGKILLed rank leaves its file behind, and a requeued job keeps its id), so a process is
signalled only while its start time still matches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import UnsafePathError
from .._safefs import open_new, private_dir, process_start_time, runtime_base

__all__ = ["Registered", "process_dir", "register_process", "registered", "unregister_process"]

logger = logging.getLogger(__name__)

_JOB = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_PID_FILE = re.compile(r"[0-9]{1,10}")


def _job_name(job_id: str | None) -> str:
    name = job_id or "local"
    if not _JOB.fullmatch(name) or name in {".", ".."}:
        raise UnsafePathError(f"job id {name!r} is not a Slurm job id (digits, or <array job>_<task>)", job=name)
    return name


def process_dir(job_id: str | None, *, create: bool = True) -> Path:
    """This node's directory of the job's training processes: ``<runtime base>/<job>``, ours and 0700 (created
    when ``create``). :class:`~slurmrt.UnsafePathError` when it is not."""
    path = runtime_base() / _job_name(job_id)
    if create:
        return private_dir(path)
    if os.path.lexists(path):
        private_dir(path)  # checks it
    return path


def register_process(job_id: str | None) -> Path | None:
    """Register this process; returns the file to remove at close, None when the directory is unusable."""
    pid = os.getpid()
    try:
        path = process_dir(job_id) / str(pid)
        record = json.dumps({"pid": pid, "start": process_start_time(pid), "job": job_id or "local"})
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a file left by a SIGKILLed process whose pid this one reuses
        fd = open_new(path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(record)
    except (OSError, UnsafePathError) as err:
        logger.warning("cannot register this process for `slurmrt signal` (%s): a signal forwarded with "
                       "`slurmrt signal` will not reach it", err)
        return None
    return path


def unregister_process(path: Path | None) -> None:
    if path is None:
        return
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the last process of the job on this node removes the directory
        path.parent.rmdir()


@dataclass(frozen=True)
class Registered:
    pid: int
    path: Path


def registered(job_id: str | None) -> list[Registered]:
    """The job's live training processes on this node. A file whose process is gone, or whose pid now names
    another process (another start time), is removed; a file not in slurmrt's form is left alone and ignored."""
    directory = process_dir(job_id, create=False)
    if not directory.is_dir():
        return []
    found = []
    for entry in sorted(directory.iterdir()):
        record = _read(entry, job_id) if _PID_FILE.fullmatch(entry.name) else None  # not ours: never touched
        if record is None:
            continue
        pid, start = record
        if start is None or process_start_time(pid) != start:
            entry.unlink(missing_ok=True)  # the process is gone, or its pid was reused
            continue
        found.append(Registered(pid, entry))
    return found


def _read(entry: Path, job_id: str | None) -> tuple[int, Any] | None:
    """(pid, start time) of a pid file of ours, for this job; None for anything else (another user's file, a
    symlink, not in slurmrt's form, another job's)."""
    try:
        st = entry.lstat()
        if not entry.is_file() or entry.is_symlink() or st.st_uid != os.getuid():
            return None
        record = json.loads(entry.read_text(encoding="utf-8"))
        pid, start = int(record["pid"]), record["start"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if pid != int(entry.name) or record.get("job") != (job_id or "local"):
        return None
    return pid, start
