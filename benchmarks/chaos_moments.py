"""What a fault campaign's faults met: each fault's phase and whether it was a moment of its own.

The simulator lists every fault it injected, with its time (``slurmrt sim``'s summary, under its ``faults`` line);
the trial's event log says what the job was doing then:

- **start-up**: the job's processes had not begun training (no event yet, or an ``init`` last);
- **saving**: a save was being written (from a ``save`` event's start, its time less its ``seconds``, to its commit);
- **stopping**: the job had decided to stop or was ending (a ``decision``, an ``exit`` last);
- **recovering**: the fault before it had not been answered yet (no start since it);
- **training**: otherwise.

Faults that land before the job started again after the fault before them are one **moment**: the job answers them
as one, and counting them apart would make a campaign look larger than what it tested.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from slurmrt.record.events import read_events, timestamp

__all__ = ["PHASES", "Met", "injected_at", "met", "phase", "read"]

PHASES = ("start-up", "training", "saving", "stopping", "recovering")
FAULT_LINE = re.compile(r"^  (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?) ([a-z-]+): (.*)$", re.M)
_STARTS = ("fresh_start", "resume")
_MARKS = {"init": "start-up", "fresh_start": "training", "resume": "training", "progress": "training",
          "decision": "stopping", "exit": "stopping"}

Met = tuple[Counter[str], int]  #: faults by phase, and the independent moments they fell in


def injected_at(output: str) -> list[tuple[float, str]]:
    """(time, kind) of each fault the simulator said it injected, in time order."""
    return sorted((datetime.fromisoformat(m[1]).timestamp(), m[2]) for m in FAULT_LINE.finditer(output))


def phase(t: float, events: list[dict[str, Any]], previous: float | None) -> str:
    """What the job was doing at ``t`` (events in time order; ``previous``: the fault before, if any)."""
    if previous is not None and not any(previous < timestamp(e) <= t for e in events if e["event"] in _STARTS):
        return "recovering"
    for save in (e for e in events if e["event"] == "save"):
        seconds = save.get("seconds")
        if isinstance(seconds, (int, float)) and timestamp(save) - seconds <= t <= timestamp(save):
            return "saving"
    marks = [e for e in events if e["event"] in _MARKS and timestamp(e) <= t]
    return _MARKS[marks[-1]["event"]] if marks else "start-up"


def met(faults: list[tuple[float, str]], events: list[dict[str, Any]]) -> Met:
    """Each fault's phase, and the independent moments: a fault in the "recovering" phase joins the moment before."""
    phases: Counter[str] = Counter()
    moments, previous = 0, None
    for t, _ in faults:
        where = phase(t, events, previous)
        phases[where] += 1
        moments += where != "recovering"
        previous = t
    return phases, moments


def read(directory: Path) -> Met:
    """A trial's faults by phase and its moments, from its ``sim.out`` and its event log (none: nothing met)."""
    out = directory / "sim.out"
    faults = injected_at(out.read_text(errors="replace")) if out.exists() else []
    events = [e for log in sorted((directory / "ckpt").glob("events-*.jsonl")) for e in read_events(log)]
    return met(faults, sorted(events, key=timestamp))
