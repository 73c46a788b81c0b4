"""Job ids for ``slurmrt sim`` that no other simulated job on this machine holds at the same time.

The id decides the job's ``MASTER_PORT`` (:func:`slurmrt.launch.topology.master_port_for`): two simulated jobs that
started in the same second once got the same id, hence the same port, and one failed with EADDRINUSE. An id is
reserved by creating ``<tmp>/.slurmrt-sim-port-<block>`` with ``O_EXCL``, where the block is the range of ports the id
maps to, so that two live reservations never share a port. The file names its holder (pid and start time): one
left by a simulator that was killed is taken back. It is removed when the simulation ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from pathlib import Path

from .._errors import SlurmrtError
from .._safefs import open_new, process_start_time
from ..launch.ports import PORT_SPAN, STEP_SLOTS

__all__ = ["release", "reserve"]

_BLOCKS = PORT_SPAN // STEP_SLOTS
_FIRST, _COUNT = 100000, 900000


def _block(job: int) -> int:
    return job % _BLOCKS


def _stale(path: Path) -> bool:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return process_start_time(int(holder["pid"])) != holder["start"]
    except (OSError, ValueError, TypeError, KeyError):
        return False  # not readable as ours: leave it alone and take another block


def reserve(directory: Path | None = None, *, tries: int = 200) -> tuple[int, Path]:
    """A free job id, and the file that reserves it (for :func:`release`)."""
    where = directory or Path(tempfile.gettempdir())
    for _ in range(tries):
        job = _FIRST + secrets.randbelow(_COUNT)
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
