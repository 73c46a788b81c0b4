"""A fault trace played into the simulated job's runs, on the job's clock (see :mod:`slurmrt.sim.faults`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import IO, Any

import psutil

from .faults import KINDS, Fault

__all__ = ["Trace"]

#: A fault that finds no task alive (a run still starting, between two in-job steps) tries again this much later.
RETRY_S = 0.2


class Trace:
    def __init__(self, faults: Sequence[Fault], out: IO[str], source: str = "") -> None:
        self.faults, self.out, self.source = list(faults), out, source
        self.clock = 0.0  #: the job's clock at the current run's start
        self.injected: dict[int, str] = {}  #: index -> what it hit
        self.when: dict[int, float] = {}  #: index -> when it was injected (seconds since the epoch)

    @property
    def on_steps(self) -> bool:
        """Whether some fault runs on the training clock (it comes at the job's first progress report past its
        step)."""
        return any(f.at_step is not None for f in self.faults)

    def schedule(self) -> list[tuple[float, str]]:
        """The faults on the job's clock not injected yet, as (seconds from the run's clock start, action) pairs; a
        fault whose moment passed while a run was ending comes at once."""
        return [(max(0.0, f.at_s - self.clock), f"fault:{i}") for i, f in enumerate(self.faults)
                if i not in self.injected and f.at_step is None]

    def due(self, step: int) -> str | None:
        """The action of the first fault on the training clock not injected yet, when the job reports that it
        trains at ``step``, at or past the fault's step; None otherwise (one report, one fault at most)."""
        return next((f"fault:{i}" for i, f in enumerate(self.faults)
                     if i not in self.injected and f.at_step is not None and f.at_step <= step), None)

    def ran(self, seconds: float) -> None:
        """A run ended after ``seconds`` on the job's clock."""
        self.clock += max(0.0, seconds)

    def inject(self, index: int, run: Any) -> tuple[float, str] | None:
        """Fault ``index`` into ``run`` (a :class:`slurmrt.sim.runner.SimRun`: its preempt, storm, fail_node and
        freeze); returns an action to schedule after it (seconds from now, action), or None. A run that is ending
        already leaves the fault to the next run."""
        # Shape: a dispatch on the fault's kind, after the checks that the run can still take one
        fault = self.faults[index]
        if run.record.ended_by or run.events.finished(run.restart):  # its training is over: nothing to rehearse
            return None
        live = [(pid, node, rank) for pid, node, rank in run.state.tasks() if _alive(pid)]
        if not live:
            return RETRY_S, f"fault:{index}"
        self.when[index] = time.time()
        if fault.kind == "preemption":
            self.injected[index] = "the job"
            run.preempt(False)
            return run.spec.grace_s, "preempt_term"
        if fault.kind == "signal-storm":
            self.injected[index] = "every task"
            run.storm()
            return None
        if fault.kind == "node-loss":
            nodes = sorted({node for _, node, _ in live})
            node = nodes[fault.target % len(nodes)]
            self.injected[index] = run.spec.node_names[node]
            run.fail_node(node)
        else:
            pid, node, rank = live[fault.target % len(live)]
            self.injected[index] = f"task {rank}"
            if fault.kind == "hang":
                run.freeze(rank)
            else:
                run.say(f"task {rank} on {run.spec.node_names[node]} crashes: SIGKILL")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        return None

    def _came_as_ended(self, fault: Fault) -> bool:
        """A fault not injected whose moment came as the job ended (one at a step the job never trained at never
        came)."""
        return fault.at_step is None and fault.at_s <= self.clock

    def lines(self) -> list[str]:
        """What the trace did, for the simulator's summary."""
        # Shape: one summary line built from optional parts, each a fact about the trace
        kinds = Counter(self.faults[i].kind for i in self.injected)
        said = ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k]) or "none"
        pending = [f for i, f in enumerate(self.faults) if i not in self.injected]
        ending = sum(map(self._came_as_ended, pending))
        head = f"faults{f' ({self.source})' if self.source else ''}: {len(self.injected)} injected ({said})"
        if ending:
            head += f"; {ending} came as the job ended"
        if len(pending) > ending and self.source.startswith("trace"):
            head += f"; {len(pending) - ending} fell after the job's end"
        return [head, *self._listed()]

    def _listed(self) -> list[str]:
        """Each fault injected, when and what it hit (the fault campaign reads them: its phases and moments)."""
        hits = sorted((self.when[i], self.faults[i].kind, hit) for i, hit in self.injected.items() if i in self.when)
        return [f"  {datetime.fromtimestamp(t).isoformat(timespec='milliseconds')} {kind}: {hit}"
                for t, kind, hit in hits]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
