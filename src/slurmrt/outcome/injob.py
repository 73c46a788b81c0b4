"""In-job restart: a failed step is replaced by a new step on a spare node of the same allocation, not a requeue.

``slurmrt run --spare-nodes S -- CMD`` (:mod:`slurmrt.launch.supervisor`) starts the training step on all but ``S``
of the job's nodes and tells its processes so through the environment (:class:`Supervised`). When slurmrt's hang
response names bad nodes (a hung rank, a lost peer, a failed health check), the rank that leads the response asks
here, instead of requeueing the job: :func:`request` either writes the request (the nodes to leave out) into the
supervisor's directory and returns, or says why not, and the caller requeues as without a supervisor. The
supervisor reads the request once the step has ended and starts the next step without those nodes.

Refused, so that the requeue with ``ExcNodeList`` takes over: no node was named; fewer spare nodes than bad ones;
``--max-in-job-restarts`` reached; the loop guard (this step and the one before it both failed without a newer
checkpoint than the one they resumed from: the same failure again, most likely not a node's).

The supervisor's directory is created by it, ours and 0700 (:func:`slurmrt._safefs.private_dir`); a request file is
created with ``O_EXCL``, one per attempt, so a planted or stale file is never read as this step's request.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._safefs import open_new, private_dir
from ..record.events import Event, EventLog, read_events, runs
from .policy import ExitCode, futile_runs

__all__ = ["ATTEMPT_ENV", "DIR_ENV", "MAX_ENV", "SPARES_ENV", "Supervised", "from_environ", "read_request",
           "request", "request_path"]

logger = logging.getLogger(__name__)

#: Set by ``slurmrt run`` in the training step's environment.
DIR_ENV = "SLURMRT_RUN_DIR"
ATTEMPT_ENV = "SLURMRT_RUN_ATTEMPT"
SPARES_ENV = "SLURMRT_RUN_SPARES"
MAX_ENV = "SLURMRT_RUN_MAX_RESTARTS"

#: Two steps in a row that failed without committing a newer checkpoint: the failure follows the job, not a node.
LOOP_GUARD = 2


@dataclass(frozen=True)
class Supervised:
    """What ``slurmrt run`` told this step: where to leave a request, which attempt this is, the spare nodes."""

    directory: Path
    attempt: int
    spares: tuple[str, ...]
    max_restarts: int


def from_environ(env: Mapping[str, str]) -> Supervised | None:
    """The supervisor's settings, or None without one. Values that ``slurmrt run`` would never write are reported
    and ignored: the step then fails over to the requeue, which loses nothing."""
    raw = env.get(DIR_ENV)
    if not raw:
        return None
    try:
        attempt, most = int(env.get(ATTEMPT_ENV, "0")), int(env.get(MAX_ENV, "0"))
        if attempt < 0 or most < 0 or not os.path.isabs(raw):
            raise ValueError
    except ValueError:
        logger.warning("%s=%r, %s=%r, %s=%r: not what `slurmrt run` sets; no in-job restart", DIR_ENV, raw,
                       ATTEMPT_ENV, env.get(ATTEMPT_ENV), MAX_ENV, env.get(MAX_ENV))
        return None
    spares = tuple(n for n in env.get(SPARES_ENV, "").split(",") if n)
    return Supervised(Path(raw), attempt, spares, most)


def request_path(directory: Path, attempt: int) -> Path:
    return directory / f"request-{attempt}.json"


def refused(sup: Supervised, bad: list[str], *, futile: int) -> str | None:
    """Why this step may not be replaced in the job (None: it may)."""
    if not bad:
        return "no node was named, so there is nothing a spare node would change"
    if sup.attempt >= sup.max_restarts:
        return f"{sup.attempt} in-job restart(s) made, the limit (--max-in-job-restarts) is {sup.max_restarts}"
    if len(sup.spares) < len(bad):
        return (f"{len(bad)} node(s) to replace ({', '.join(bad)}) but {len(sup.spares)} spare(s) left"
                + (f" ({', '.join(sup.spares)})" if sup.spares else ""))
    if futile >= LOOP_GUARD:
        return (f"the last {futile} steps failed without a checkpoint newer than the one they resumed from: the "
                "same failure again, which another node would most likely not cure")
    return None


def request(sup: Supervised, events: EventLog, bad: list[str], code: ExitCode, *, node: str,
            why: str = "", step: int | None = None, reasons: list[str] | None = None) -> str | None:
    """Ask the supervisor for a new step without ``bad``; record it and the exit in the event log. Returns what was
    done, or None when refused (logged, and recorded as an ``in_job_refused`` event): the caller requeues."""
    futile = futile_runs(runs(read_events(events.path))) \
        if events.path is not None and events.path.exists() else 0
    no = refused(sup, bad, futile=futile)
    if no is None:
        no = _write(sup, {"attempt": sup.attempt, "exclude": bad, "code": int(code), "node": node, "why": why})
    if no is not None:
        logger.error("no in-job restart: %s; falling back to the requeue", no)
        events.emit(Event.IN_JOB_REFUSED, nodes=bad, why=no, lead=True)
        return None
    name = code.name
    message = f"in-job restart {sup.attempt + 1}: a new step without {', '.join(bad)}"
    logger.warning("%s (spares: %s)", message, ", ".join(sup.spares))
    events.emit(Event.IN_JOB_RESTART, nodes=bad, spares=list(sup.spares), why=why, next_attempt=sup.attempt + 1,
                lead=True)
    events.emit(Event.EXIT, code=int(code), outcome=name, why=message, reasons=reasons or [name.lower()],
                step=step, lead=True)
    return message


def _write(sup: Supervised, data: dict[str, Any]) -> str | None:
    """The request file, created once (``O_EXCL``) in the supervisor's private directory; why not, or None."""
    try:
        private_dir(sup.directory)  # exists, ours, 0700: checked, not created by a rank
        fd = open_new(request_path(sup.directory, sup.attempt))
        try:
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except FileExistsError:  # another rank asked first (ranks of one node that failed its health check)
        if read_request(sup.directory, sup.attempt) is not None:
            return None
        return f"{request_path(sup.directory, sup.attempt)} exists and is not a request slurmrt wrote"
    except Exception as err:  # an unsafe or unreachable directory: the requeue still works
        return f"cannot leave the request in {sup.directory}: {err}"
    return None


def read_request(directory: Path, attempt: int) -> dict[str, Any] | None:
    """The step's request (``slurmrt run``'s side), or None: none, or not a well-formed one (reported)."""
    path = request_path(directory, attempt)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.error("in-job restart request %s unreadable: %s", path, err)
        return None
    if not (isinstance(data, dict) and data.get("attempt") == attempt and isinstance(data.get("exclude"), list)
            and data["exclude"] and all(isinstance(n, str) and n for n in data["exclude"])):
        logger.error("in-job restart request %s is not one slurmrt writes: %r", path, data)
        return None
    return data
