"""What a run's in-process restarts (``slurmrt.run_restartable``) cost, counted once from its ``in_process`` events
for every reader: ``slurmrt status`` (its header, lost steps and ``--json``), the goodput ledger, the simulator's
summary.

For each restart: from rank 0's catch of the fault to the generation's next load is recovery, and the steps from
the checkpoint the next generation resumed after to the fault were trained twice (lost work, in steps and in
seconds). A restart after an unhealthy step (``rt.check``'s ladder: its ``training_health`` events, in order, match
the ``TrainingHealthError`` restarts) counts both as its rung's own: the re-run's or the rewind's, and a rewind's
skipped steps are counted beside. Every time is rank 0's: the fault's time in the event is its own catch
(runtime/inprocess.py), so two hosts' clocks never meet in one duration.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import Any

from .. import _figures as figures
from .events import Event, timestamp
from .runs import Run

__all__ = ["InProcessCost", "in_process_cost", "local_served"]


@dataclass(frozen=True)
class InProcessCost:
    restarts: int = 0  #: the restarts made (a refusal is none)
    back_s: float = 0.0  #: from each fault to the next load's end: recovery
    redone_steps: int = 0  #: steps trained again, from the checkpoint resumed after to the fault
    redone_s: float = 0.0  #: the time those steps took the first time: lost work
    #: the restarts the local tier could serve: the next generation read it, or it held one (:func:`local_served`)
    from_local: int = 0
    #: The same (recovery and redone work together) of the restarts after an unhealthy step, by rung ("rerun",
    #: "rewind"): not in back_s and redone_s.
    rerun_s: float = 0.0
    rewind_s: float = 0.0
    skipped_steps: int = 0  #: the steps whose batches rewinds skipped

    def __add__(self, other: InProcessCost) -> InProcessCost:
        return InProcessCost(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def rung(self, action: str) -> InProcessCost:
        """This restart's cost, as the re-run's or the rewind's (``action``; anything else: as it is)."""
        if action not in ("rerun", "rewind"):
            return self
        whole = self.back_s + self.redone_s
        return replace(self, back_s=0.0, redone_s=0.0, rerun_s=whole if action == "rerun" else 0.0,
                       rewind_s=whole if action == "rewind" else 0.0)


def in_process_cost(run: Run) -> InProcessCost:
    """``run``'s in-process restarts. The work lost to one counts from the newest save before its fault, and never
    from before the run's first load (its start-up and load are the ledger's, not lost work)."""
    first = run.first_load
    ready = timestamp(first) if first is not None else run.start
    loads = sorted(((timestamp(e), e) for e in (*run.all(Event.RESUME), *run.all(Event.FRESH_START))),
                   key=lambda pair: pair[0])
    saves = [timestamp(e) for e in run.all(Event.SAVE)]
    rungs = iter(run.all(Event.TRAINING_HEALTH))
    total = InProcessCost()
    for e in run.all(Event.IN_PROCESS):
        health = next(rungs, {}) if str(e.get("error", "")).startswith("TrainingHealthError") else {}
        if e.get("action") == "restart":
            total += _one(e, loads, saves, ready).rung(str(health.get("action")))
            total += InProcessCost(skipped_steps=_skipped(health))
    return total


def _skipped(health: dict[str, Any]) -> int:
    """The steps a rewind skipped: from after its certified step to the faulty one."""
    step, to = health.get("step"), health.get("certified")
    if health.get("action") != "rewind" or not isinstance(step, int) or not isinstance(to, int):
        return 0
    return max(0, step - to)


def _one(e: dict[str, Any], loads: list[tuple[float, dict[str, Any]]], saves: list[float],
         ready: float) -> InProcessCost:
    """One restart's cost: to the first load after its fault, and from the newest save before it (a record without
    a readable fault time counts as a restart, of unknown cost)."""
    fault = figures.epoch(e.get("fault_time"))
    if fault is None:
        return InProcessCost(1)
    after = next((load for t, load in loads if t >= fault), None)
    back = max(0.0, timestamp(after or e) - fault)
    redone_s = max(0.0, fault - max([ready, *(t for t in saves if t <= fault)]))
    local = local_served(after)
    return InProcessCost(1, back, _redone_steps(e.get("step"), after), redone_s, int(local))


def _redone_steps(step: object, after: dict[str, Any] | None) -> int:
    """From the step the generation resumed after (a fresh start: before step 0) to the fault's step."""
    resumed = after.get("step", -1) if after is not None else None
    return max(0, step - resumed) if isinstance(step, int) and isinstance(resumed, int) else 0


def local_served(load: dict[str, Any] | None) -> bool:
    """Whether a load (a ``resume`` event) says the local tier could serve the failure before it: it read the
    local tier, or the local tier held a whole checkpoint of its own."""
    if load is None or load.get("event") != Event.RESUME.value:
        return False
    held = load.get("local_held")
    return load.get("tier") == "local" or (isinstance(held, int) and not isinstance(held, bool))
