"""Job ids for ``slurmrt sim`` that no other simulated job on this machine holds at the same time.

The id decides the job's ``MASTER_PORT`` (:func:`slurmrt.launch.topology.master_port_for`): two simulated jobs that
started in the same second once got the same id, hence the same port, and one failed with EADDRINUSE. An id is
reserved by creating ``<tmp>/.slurmrt-sim-port-<block>`` with ``O_EXCL``, where the block is the range of ports the id
maps to, so that two live reservations never share a port. The file names its holder (pid and start time): one
left by a simulator that was killed is taken back. It is removed when the simulation ends.

A Slurm on the same machine (a test cluster, a workstation's own) numbers its jobs up from its ``FirstJobId`` (1 by
default), and so fills the blocks from the bottom: simulated ids keep to the upper half of the blocks, which such a
Slurm reaches only at its 2,846th job.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from pathlib import Path

from .._errors import SlurmrtError
from .._safefs import open_new, process_start_time, read_capped
from ..launch.ports import PORT_SPAN, STEP_SLOTS

__all__ = ["release", "reserve"]

_BLOCKS = PORT_SPAN // STEP_SLOTS
_LOWEST = _BLOCKS // 2  # the first block a simulated id may take
_FIRST, _LAST = 100000 // _BLOCKS + 1, 999999 // _BLOCKS  # ids of six digits: _BLOCKS * round + block


def _draw() -> int:
    """A six-digit id whose block lies in the upper half."""
    return (_FIRST + secrets.randbelow(_LAST - _FIRST)) * _BLOCKS + _LOWEST + secrets.randbelow(_BLOCKS - _LOWEST)


def _block(job: int) -> int:
    return job % _BLOCKS


def _stale(path: Path) -> bool:
    """Whether the reservation ``path`` (in a directory every user shares: a FIFO or a link may be planted under its
    name) was left by a simulator that is gone; read as a small regular file of its own only, never waited on."""
    try:
        holder = json.loads(read_capped(path, 4096))
        return process_start_time(int(holder["pid"])) != holder["start"]
    except (OSError, ValueError, TypeError, KeyError):
        return False  # not readable as ours: leave it alone and take another block


def reserve(directory: Path | None = None, *, tries: int = 200) -> tuple[int, Path]:
    """A free job id, and the file that reserves it (for :func:`release`)."""
    where = directory or Path(tempfile.gettempdir())
    for _ in range(tries):
        job = _draw()
        path = where / f".slurmrt-sim-port-{_block(job)}"
        try:
            fd = open_new(path, 0o644)
        except FileExistsError:
            if _stale(path):
                with contextlib.suppress(OSError):
                    path.unlink()  # its simulator is gone; another try may take the block
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "start": process_start_time(os.getpid()), "job": job}, f)
        return job, path
    raise SlurmrtError(f"no free job id for the simulator after {tries} tries: {where} holds "
                       f"{len(list(where.glob('.slurmrt-sim-port-*')))} reservations; remove the stale ones, or "
                       "give the job an id (its JobSpec.job_id)")


def release(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
