"""Keep a bad node out of the requeued job: ``scontrol update JobId=... ExcNodeList=...``.

Measured on the test cluster (Slurm 22.05+, tests/slurm): the update is refused while the job runs ("Job is no
longer pending execution", exit 1) and accepted once ``scontrol requeue`` has put it back to PENDING. So slurmrt
requeues first, then excludes, from the same process, within a second.

The list only grows (a node excluded by an earlier run stays excluded), and never past a limit: at most
``max_excluded`` nodes, and never so many that fewer nodes than the job needs remain among its partition's nodes that
can run jobs (down and drained ones do not count), so that a job cannot exclude itself out of the partition: the
fault campaign's cluster series left a 2-node job excluding n1 and n2 of 4 nodes with n3 drained, pending for ever
(ReqNodeNotAvail). A user lists the exclusions with ``scontrol show job JOB | grep
ExcNodeList`` (and in the event log, ``exclude`` events) and clears them with ``scontrol update JobId=JOB
ExcNodeList=`` while the job is pending.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection
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
         room: int | None = None, usable: Collection[str] | None = None) -> Plan:
    """Add ``bad`` to ``current`` exclusions, up to ``max_excluded`` in all and ``room`` new ones among the nodes
    that can run jobs (the partition's ``usable`` nodes the job can spare; None: unknown). A node that cannot run
    a job anyway (down, drained) costs no room: excluding it takes nothing from the job."""
    merged = list(dict.fromkeys(current))
    added: list[str] = []
    refused: list[str] = []
    spent = 0
    for node in dict.fromkeys(bad):
        if node in merged:
            continue
        costs = usable is None or node in usable
        if len(merged) >= max_excluded or (room is not None and costs and spent >= max(room, 0)):
            refused.append(node)
            continue
        merged.append(node)
        added.append(node)
        spent += costs
    why = ""
    if refused:
        why = (f"not excluded: {', '.join(refused)}: the job already excludes {len(merged)} node(s), the limit is "
               f"max_excluded_nodes={max_excluded}" +
               (f", and {max(room, 0)} node(s) of the partition that can run jobs to spare" if room is not None
                else ""))
    return Plan(tuple(merged), tuple(added), tuple(refused), why)


def parse_job(text: str) -> JobNodes:
    """``scontrol show job -o JOB``'s fields that matter here."""
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


#: ``sinfo``'s states (``%T``) of a node that can run a job; any other (down, drained, draining, failing, in
#: maintenance, not responding: a ``*`` after the state) cannot.
_USABLE = {"idle", "mixed", "allocated", "completing", "planned"}


def usable_nodes(partition: str) -> set[str] | None:
    """The partition's nodes that can run a job now (``sinfo -o "%N %T"``); None when not known."""
    out = _slurm.run("sinfo", "-h", "-p", partition, "-o", "%N %T")
    if isinstance(out, str) or out.returncode != 0:
        return None
    usable: set[str] = set()
    try:
        for line in out.stdout.splitlines():
            names, _, state = line.strip().partition(" ")
            if names and state.strip().lower() in _USABLE:
                usable.update(hostlist.expand(names))
    except HostlistError:
        return None
    return usable or None


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


def prepare(job_id: str, bad: list[str], *, max_excluded: int) -> Plan | str:
    """The exclusions to set once the job is requeued: ``bad`` added to what the job excludes, within the limits; or
    why not, in words. Read while the job still runs (its ExcNodeList cannot change then): after the requeue every
    second counts, as Slurm kills the requeuing process KillWait after it."""
    job = read_job(job_id)
    if isinstance(job, str):
        return job
    usable = usable_nodes(job.partition) if job.partition else None
    room = None if usable is None or job.num_nodes is None else \
        len(usable - set(job.excluded)) - job.num_nodes
    return plan(job.excluded, bad, max_excluded=max_excluded, room=room, usable=usable)


def apply_and_record(job_id: str, prepared: Plan | str, events: EventLog) -> None:
    """Set the (requeued, pending) job's exclusions as :func:`prepare` planned them; log it, and record it as an
    ``exclude`` event (nothing as excluded unless Slurm took it)."""
    excluded, said = None, prepared if isinstance(prepared, str) else prepared.why or "nothing new to exclude"
    if isinstance(prepared, Plan) and prepared.added:
        done, message = apply(job_id, prepared.nodes)
        excluded, said = (prepared, message + (f"; {prepared.why}" if prepared.why else "")) if done else \
            (None, message)
    elif isinstance(prepared, Plan):
        excluded = prepared
    logger.warning("%s", said)
    events.emit(Event.EXCLUDE, nodes=list(excluded.nodes) if excluded else None,
                added=list(excluded.added) if excluded else [], refused=list(excluded.refused) if excluded else [],
                message=said)
