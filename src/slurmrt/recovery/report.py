"""What ``slurmrt run`` says about an in-job restart: one block (what failed, where, what was done, how long it took,
where the stacks are) in place of every rank's traceback and thread stacks (issue 39: a recovery that worked must
not read like a crash)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._text import shorten
from ..launch import hostlist
from ..record.events import Event, EventLog
from .plan import Action, Decision, FaultClass, NodeEvidence, Trigger

__all__ = ["Failure", "block", "recorded", "stacks_path", "stacks_pattern"]


@dataclass(frozen=True)
class Failure:
    """A step that failed and is replaced: its attempt, exit code, the nodes left out, why (the leader's words),
    when slurmrt found it (epoch s: the leader's request says; for a node failure, when the step ended), and the
    glob of the ranks' stacks files (None: not written, or a node failure nobody in the step could see)."""

    attempt: int
    code: int
    nodes: tuple[str, ...]
    why: str
    since: float
    stacks: str | None = None
    #: ``slurmrt run``'s class of the fault (:class:`~slurmrt.recovery.plan.FaultClass`), once judged.
    fault: str = ""
    #: Why the step stopped on purpose, at an agreed step, to leave a node out ("" when it failed): a straggler's, or
    #: one that computed a step wrong (rt.check). Nothing failed.
    planned: str = ""

    @classmethod
    def asked(cls, request: dict[str, Any], attempt: int, code: int, nodes: list[str]) -> Failure:
        """The failure an in-job request describes (its fields are the leader's; a missing or malformed one
        reads as unknown: the request file is this job's, but the block must not fail on it)."""
        why, since, stacks = request.get("suspects") or request.get("why"), request.get("since"), request.get("stacks")
        trigger = str(request.get("trigger"))
        planned = request.get("planned") is True or trigger == Trigger.STRAGGLER.value  # a straggler's: always
        return cls(attempt, code, tuple(nodes), str(why) if why else f"{', '.join(nodes)} failed",
                   float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else time.time(),
                   stacks if isinstance(stacks, str) else None,
                   planned=_PLANNED.get(trigger, "") if planned else "")


#: What a stop made on purpose to leave a node out was for, by the request's trigger.
_PLANNED = {Trigger.STRAGGLER.value: "to leave a straggler out",
            Trigger.UNHEALTHY.value: "to leave out a node that computed a step wrong"}


def stacks_path(events: Path | None, job: str | None, restart: int, attempt: int, rank: int) -> Path | None:
    """Where a rank of a step writes its stacks and traceback when it fails (:mod:`slurmrt.hang.stacks`): beside the
    event log; None without one."""
    if events is None:
        return None
    return events.parent / f"stacks-{job or 'local'}-{restart}.{attempt}-rank{rank}.txt"


def stacks_pattern(events: Path | None, job: str | None, restart: int, attempt: int) -> str | None:
    """Every rank's stacks files of a step, as a glob a user can type."""
    one = stacks_path(events, job, restart, attempt, 0)
    return None if one is None else str(one.with_name(one.name.removesuffix("0.txt") + "*.txt"))


def block(failure: Failure, attempt: int, max_in_job_restarts: int, nodes: tuple[str, ...], spares: tuple[str, ...],
          now: float | None = None) -> list[str]:
    """The lines, without the ``slurmrt run:`` prefix."""
    took = max(0.0, (time.time() if now is None else now) - failure.since)
    what = f"  stopped:  step {failure.attempt}, {failure.planned}: " if failure.planned else \
        f"  failed:   step {failure.attempt} (exit code {failure.code}): "
    lines = [f"in-job restart {attempt} of at most {max_in_job_restarts}:", what + shorten(failure.why),
             f"  left out: {', '.join(failure.nodes) or 'none (no node evidence): the same nodes'}" +
             (f" ({failure.fault.replace('_', ' ')})" if failure.fault else ""),
             f"  new step: {attempt} on {hostlist.compress(list(nodes))}" +
             (f", spare {hostlist.compress(list(spares))}" if spares else ", no spare left"),
             f"  took:     {took:.1f} s from the {'stop' if failure.planned else 'failure'} to the new step"]
    if failure.stacks:
        lines.append(f"  stacks:   {failure.stacks}")
    return lines


def recorded(events: EventLog, trigger: Trigger, fault: FaultClass, evidence: list[NodeEvidence], decision: Decision,
             nodes: tuple[str, ...], attempt: int, failure: Failure | None) -> str:
    """Record ``slurmrt run``'s decision on failed step ``attempt`` of ``nodes``, with its evidence (a ``recovery``
    event); the line to say, "" for a new step (whose block says it, with the class: one account, not two)."""
    left = list(decision.exclude)
    why = decision.in_job_refused or decision.why
    named: dict[str, Any] = {"class": fault.value}  # a keyword of Python's
    events.emit(Event.RECOVERY, trigger=trigger.value, evidence=[e.to_json(trigger) for e in evidence],
                action=decision.action.value, kept=[n for n in nodes if n not in left], left_out=left, why=why,
                lead=True, **named)
    if decision.action is Action.IN_JOB_RESTART:
        return ""
    said = f"{failure.why}; " if failure is not None and not failure.stacks else ""
    return (f"{said}step {attempt}: {fault.value.replace('_', ' ')} ({trigger.value}); "
            f"{decision.action.value.replace('_', ' ')}" + (f" without {', '.join(left)}" if left else "") + f": {why}")
