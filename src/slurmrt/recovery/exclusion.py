"""Keep a bad node out of the requeued job: ``scontrol update JobId=... ExcNodeList=...``.

Measured on the test cluster (Slurm 22.05+, tests/slurm): the update is refused while the job runs ("Job is no
longer pending execution", exit 1) and accepted once ``scontrol requeue`` has put it back to PENDING. So slurmrt
requeues first, then excludes, from the same process, within a second.

The list only grows (a node excluded by an earlier run stays excluded), and never past a limit: at most
``max_excluded`` nodes, and never so many that fewer nodes than the job needs remain in its partition, so that a job
cannot exclude itself out of the partition. Every node of the partition counts, down and drained ones too: they come
back, and an exclusion stays (the fault campaign's cluster series, counting only the nodes up, excluded three of
four nodes while they were down and left a 3-node job pending for ever, BadConstraints). The job's node count is the
one it was allocated (``needed``): a --no-kill job that lost nodes shows fewer, but its requeue asks for them all. A
user lists the exclusions with ``scontrol show job JOB | grep ExcNodeList`` (and in the event log, ``exclude``
events) and clears them with ``scontrol update JobId=JOB ExcNodeList=`` while the job is pending.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from .. import _clock, _slurm
from .._errors import HostlistError
from ..launch import hostlist
from ..record.events import Event, EventLog

__all__ = ["Plan", "apply", "apply_and_record", "plan", "prepare", "read_job"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobNodes:
    """What ``scontrol show job`` says about the job's nodes."""

    excluded: tuple[str, ...]
    num_nodes: int | None
    partition: str | None
    #: The nodes the job holds now (a node that failed in a --no-kill job leaves it); None when not said.
    nodes: tuple[str, ...] | None = None
    state: str | None = None
    #: The node the batch script runs on, the job's requeues so far, and its output file (for the guard).
    batch_host: str | None = None
    restarts: int | None = None
    std_out: str | None = None


@dataclass(frozen=True)
class Plan:
    """The exclusions to set: ``nodes`` (the old ones first), ``added``, and ``refused`` with why."""

    nodes: tuple[str, ...]
    added: tuple[str, ...]
    refused: tuple[str, ...]
    why: str = ""


def plan(current: tuple[str, ...] | list[str], bad: list[str], *, max_excluded: int,
         room: int | None = None) -> Plan:
    """Add ``bad`` to ``current`` exclusions, up to ``max_excluded`` in all and ``room`` new ones (the partition's
    nodes the job can spare; None: unknown)."""
    merged = list(dict.fromkeys(current))
    added: list[str] = []
    refused: list[str] = []
    limit = max_excluded if room is None else min(max_excluded, len(merged) + max(room, 0))
    for node in dict.fromkeys(bad):
        if node in merged:
            continue
        if len(merged) >= limit:
            refused.append(node)
            continue
        merged.append(node)
        added.append(node)
    why = ""
    if refused:
        why = (f"not excluded: {', '.join(refused)}: the job already excludes {len(merged)} node(s), the limit is "
               f"{limit} (max_excluded_nodes={max_excluded}" +
               (f", {room} node(s) of the partition to spare)" if room is not None else ")"))
    return Plan(tuple(merged), tuple(added), tuple(refused), why)


def parse_job(text: str) -> JobNodes:
    """``scontrol show job -o JOB``'s fields that matter here."""
    # Shape: one field per line of scontrol's output, each read leniently where Slurm may print (null)
    fields: dict[str, str] = {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", text)}
    raw = fields.get("ExcNodeList", "")
    excluded = tuple(hostlist.expand(raw)) if raw and raw != "(null)" else ()
    num = fields.get("NumNodes", "")
    held = fields.get("NodeList", "")
    try:
        nodes = tuple(hostlist.expand(held)) if held and held != "(null)" else None
    except HostlistError:
        nodes = None
    restarts = fields.get("Restarts", "")
    return JobNodes(excluded, int(num.split("-")[0]) if num.split("-")[0].isdigit() else None,
                    fields.get("Partition") or None, nodes, fields.get("JobState") or None,
                    _given(fields.get("BatchHost")), int(restarts) if restarts.isdigit() else None,
                    _given(fields.get("StdOut")))


def _given(value: str | None) -> str | None:
    return value if value and value not in ("(null)", "None") else None


def read_job(job_id: str) -> JobNodes | str:
    out = _slurm.run("scontrol", "show", "job", "-o", job_id)
    if isinstance(out, str):
        return out
    if out.returncode != 0:
        return f"scontrol show job {job_id} failed: {out.stderr.strip()}"
    return parse_job(out.stdout)


def partition_nodes(partition: str) -> int | None:
    """How many nodes the partition has, down and drained ones too: they come back, and an exclusion stays."""
    out = _slurm.run("sinfo", "-h", "-p", partition, "-o", "%D")
    if isinstance(out, str) or out.returncode != 0:
        return None
    counts = [int(x) for x in out.stdout.split() if x.isdigit()]
    return sum(counts) if counts else None


#: How long :func:`apply` tries again while slurmctld says "try again in a bit". Short: after a node left a
#: --no-kill job, slurmctld refuses the update for as long as the requeued job completes (docs/slurm.md), and the
#: process that asks is one of those it waits for.
RETRY_S = 3.0


def apply(job_id: str, nodes: tuple[str, ...], *, retry_s: float = RETRY_S) -> tuple[bool, str]:
    """Set the job's ExcNodeList to ``nodes`` (the job must be pending)."""
    deadline = _clock.mono() + retry_s
    while True:
        out = _slurm.run("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}")
        if isinstance(out, str):
            return False, out
        if out.returncode == 0:
            return True, f"job {job_id} now excludes {hostlist.compress(nodes)}"
        said = out.stderr.strip()
        if "try again" not in said.lower() or _clock.mono() >= deadline:
            return False, f"scontrol update JobId={job_id} ExcNodeList=... refused: {said}"
        time.sleep(0.5)


def prepare(job_id: str, bad: list[str], *, max_excluded: int, needed: int | None = None) -> Plan | str:
    """The exclusions to set once the job is requeued: ``bad`` added to what the job excludes, within the limits; or
    why not, in words. Read while the job still runs (its ExcNodeList cannot change then): after the requeue every
    second counts, as Slurm kills the requeuing process KillWait after it."""
    job = read_job(job_id)
    if isinstance(job, str):
        return job
    total = partition_nodes(job.partition) if job.partition else None
    wanted = max(job.num_nodes or 0, needed or 0) or None
    room = None if total is None or wanted is None else total - wanted - len(job.excluded)
    return plan(job.excluded, bad, max_excluded=max_excluded, room=room)


def _level(excluded: Plan | None) -> int:
    """Done as planned is part of a recovery that works: INFO. Refused, or not applied: the user should look."""
    return logging.INFO if excluded is not None and not excluded.refused else logging.WARNING


def apply_and_record(job_id: str, prepared: Plan | str, events: EventLog) -> None:
    """Set the (requeued, pending) job's exclusions as :func:`prepare` planned them; log it, and record it as an
    ``exclude`` event (nothing as excluded unless Slurm took it)."""
    # Shape: three cases (nothing new, applied, refused) folded into one record, so every case writes it
    excluded, said = None, prepared if isinstance(prepared, str) else prepared.why or "nothing new to exclude"
    if isinstance(prepared, Plan) and prepared.added:
        done, message = apply(job_id, prepared.nodes)
        excluded, said = (prepared, message + (f"; {prepared.why}" if prepared.why else "")) if done else \
            (None, message)
    elif isinstance(prepared, Plan):
        excluded = prepared
    logger.log(_level(excluded), "%s", said)
    events.emit(Event.EXCLUDE, nodes=list(excluded.nodes) if excluded else None,
                added=list(excluded.added) if excluded else [], refused=list(excluded.refused) if excluded else [],
                message=said)
