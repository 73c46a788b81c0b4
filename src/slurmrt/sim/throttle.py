"""``slurmrt sim --slow-node``: a node whose tasks run ``slow_factor`` times slower, as on a slow GPU or a throttled
CPU."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from . import processes
from .spec import JobSpec
from .state import SimState

__all__ = ["SLOW_TICK_S", "Throttle"]

#: How often the slowed node's CPU time is charged.
SLOW_TICK_S = 0.002


class Throttle:
    """Every :data:`SLOW_TICK_S`, the CPU time the node's processes ran since the last tick is charged
    ``slow_factor - 1`` times over as a stop (SIGSTOP to each task's process group, SIGCONT after). So the work
    they do takes about ``slow_factor`` times as long, and their sleeps and their waits for the other ranks do not.
    Charging the CPU time, not a share of the wall clock, keeps the slowdown when the machine's cores are shared: a
    node stopped for a fixed part of each period was hardly slowed when it would have waited for a core anyway. The
    tasks of later steps on the node are found as they start."""

    def __init__(self, spec: JobSpec, state: SimState) -> None:
        self.spec, self.state = spec, state
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-slow-node", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        spec = self.spec
        extra = spec.slow_factor - 1
        ran: dict[int, int] = {}
        groups: list[int] = []
        watched: list[int] = []
        refreshed = 0.0
        while not self._stopped.wait(SLOW_TICK_S):
            if time.monotonic() - refreshed > 0.25:
                node = spec.node_names.index(spec.slow_name) if spec.slow_name in spec.node_names else None
                groups = [pid for pid, n, _ in self.state.tasks() if n == node]
                watched = processes.family(groups)
                refreshed = time.monotonic()
            used = 0
            for pid in watched:
                now = processes.run_ns(pid)
                used += max(0, now - ran.get(pid, now))  # a process counts from its first reading
                ran[pid] = now
            if used:
                _group_signal(groups, signal.SIGSTOP)
                self._stopped.wait(used * extra / 1e9)
                _group_signal(groups, signal.SIGCONT)
        _group_signal([pid for pid, _, _ in self.state.tasks()], signal.SIGCONT)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(5)


def _group_signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
