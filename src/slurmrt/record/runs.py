"""The event log read back as runs: rank 0's events grouped by run (restart, then in-job attempt), and what the
earlier runs of a job measured (step and save times, phases), for the deadline and the goodput ledger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from .. import _figures as figures
from .._safefs import NotOwnError, open_regular
from .events import Event, malformed, read_events, stall, timestamp

__all__ = ["Measured", "Run", "measured", "measured_earlier", "run_of", "runs", "runs_of"]

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """One run of a job (one value of ``restart``, and of ``attempt`` after in-job restarts), as rank 0's events
    tell it."""

    restart: int
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The step within the run: 0, then one more for each in-job restart (``slurmrt run``).
    attempt: int = 0

    @property
    def label(self) -> str:
        """``3`` for restart 3, ``3.1`` for its first in-job restart."""
        return f"{self.restart}.{self.attempt}" if self.attempt else str(self.restart)

    def first(self, event: Event) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == event.value), None)

    def all(self, event: Event) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event.value]

    @property
    def start(self) -> float:
        return timestamp(self.events[0])

    @property
    def end(self) -> float:
        return timestamp(self.events[-1])

    @property
    def first_load(self) -> dict[str, Any] | None:
        """The run's first load, its ``resume`` or ``fresh_start`` (the loads after an in-process restart apart)."""
        return next((e for e in self.events if e.get("event") in (Event.RESUME.value, Event.FRESH_START.value)), None)

    @property
    def resumed_from(self) -> int | None:
        """The step the run's first load resumed from; None for a fresh start."""
        load = self.first_load
        return load.get("step") if load is not None and load.get("event") == Event.RESUME.value else None

    @property
    def reasons(self) -> tuple[str, ...]:
        decision = self.first(Event.DECISION)
        return tuple(decision.get("reasons", ())) if decision else ()

    @property
    def exit(self) -> dict[str, Any] | None:
        """The run's ``exit`` event: how slurmrt ended it (the executor writes one per run), or None."""
        return self.first(Event.EXIT)

    @property
    def left_out(self) -> tuple[str, ...] | None:
        """The nodes the next step of the run left out (None: no in-job restart was recorded): ``slurmrt run``'s
        judgement of the fault (its ``recovery`` event) where it made one, since the evidence may clear the
        suspects; else the nodes of the suspects the step named (its ``in_job_restart`` event)."""
        judged, moved = self.first(Event.RECOVERY), self.first(Event.IN_JOB_RESTART)
        said = judged.get("left_out") if judged is not None else moved.get("nodes") if moved is not None else None
        if judged is None and moved is None:
            return None
        return tuple(str(n) for n in said) if isinstance(said, list) else ()

    @property
    def last_checkpoint(self) -> int | None:
        saves = self.all(Event.SAVE)
        return saves[-1].get("step") if saves else None


def runs(events: Iterable[dict[str, Any]]) -> list[Run]:
    """Rank 0's events (and rankless ones, those a leading rank recorded for the run, and every rank's hangs) grouped
    by run (restart, then in-job attempt), oldest run first."""
    by_run: dict[tuple[int, int], Run] = {}
    for e in events:
        # The rank that led a hang response (the lowest that answered: not 0 when rank 0 was the one lost) marks what
        # it records for the whole run ("lead"). Every rank's hang says when its wait began: a frozen rank 0 says
        # nothing until it wakes, after the hang was answered.
        if (e.get("rank") in (0, None) or e.get("lead") is True or e.get("event") == Event.HANG.value) and "time" in e:
            key = int(e.get("restart", 0)), int(e.get("attempt", 0))
            by_run.setdefault(key, Run(*key[:1], attempt=key[1])).events.append(e)
    return [by_run[k] for k in sorted(by_run)]


def runs_of(path: Path | None) -> list[Run]:
    """The runs of the event log at ``path`` (:func:`runs`); none when there is no log or it cannot be read (a FIFO
    or a link planted in its place, a read error): what reads it to decide goes on as with no history."""
    if path is None or not path.exists():
        return []
    try:
        return runs(read_events(path, own=True))
    except OSError:
        return []


def run_of(path: Path | None, restart: int, attempt: int) -> Run | None:
    """Run ``restart``'s step ``attempt`` (its in-job attempt) in the event log at ``path``; None when it recorded
    nothing."""
    return next((r for r in runs_of(path) if r.restart == restart and r.attempt == attempt), None)


def _tail(path: Path | None, tail_bytes: int) -> list[dict[str, Any]]:
    """Rank 0's events in the last ``tail_bytes`` of the log (none when it cannot be read)."""
    if path is None:
        return []
    try:
        with os.fdopen(open_regular(path, own=True), "rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - tail_bytes)
            f.seek(start)
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except NotOwnError as err:
        logger.warning("%s", err)
        return []
    except OSError:
        return []
    out = []
    for line in lines[1:] if start else lines:  # read from the middle of the file: the first line is cut
        try:
            e = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if malformed(e) is None and e.get("rank") in (0, None):
            out.append(e)
    return out


def _number(value: Any) -> TypeGuard[float]:
    return figures.seconds(value) is not None


@dataclass(frozen=True)
class Measured:
    """What the earlier runs of a job measured: the step time rank 0 reported last, the longest of its last three
    saves (shared tier: the time a stop's save takes), each tier's last three stalls (what the saves held the
    training: ``rt.should_save``'s costs), and the longest duration of each phase (``rt.phase``). None (or empty)
    where nothing was."""

    step_s: float | None = None
    save_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    stalls: dict[str, list[float]] = field(default_factory=dict)


def measured_earlier(path: Path | None, *, tail_bytes: int = 256 * 1024) -> Measured:
    """:class:`Measured`, from one read of the last ``tail_bytes`` of the event log."""
    # Shape: one pass over the tail, one case per kind of event measured
    step_s: float | None = None
    saves: list[float] = []
    stalls: dict[str, list[float]] = {"shared": [], "local": []}
    phases: dict[str, float] = {}
    for e in _tail(path, tail_bytes):
        kind, value, seconds, name = e.get("event"), e.get("step_s"), e.get("seconds"), e.get("name")
        tier = _tier(e) if kind == Event.SAVE.value else None
        if kind in (Event.PROGRESS.value, Event.DECISION.value) and _number(value):
            step_s = float(value)
        elif tier is not None:
            _save(e, tier, saves, stalls)
        elif kind == Event.PHASE.value and isinstance(name, str) and _number(seconds):
            phases[name] = max(phases.get(name, 0.0), float(seconds))
    return Measured(step_s, max(saves[-3:]) if saves else None, phases,
                    {tier: found[-3:] for tier, found in stalls.items() if found})


def _save(save: dict[str, Any], tier: str, saves: list[float], stalls: dict[str, list[float]]) -> None:
    """A save event into the shared tier's save times (the deadline's input: a save's whole time), and its tier's
    stalls."""
    seconds, held = save.get("seconds"), stall(save)
    if tier == "shared" and _number(seconds):
        saves.append(float(seconds))
    if held is not None:
        stalls[tier].append(held)


def _tier(save: dict[str, Any]) -> str | None:
    """The tier a save event names ("shared" when it names none), or None for a value that is neither."""
    tier = save.get("tier", "shared")
    return tier if tier in ("shared", "local") else None


def measured(path: Path | None, *, tail_bytes: int = 256 * 1024) -> tuple[float | None, float | None]:
    """(step seconds, save seconds) of :func:`measured_earlier`; (None, None) when there is nothing."""
    m = measured_earlier(path, tail_bytes=tail_bytes)
    return m.step_s, m.save_s
