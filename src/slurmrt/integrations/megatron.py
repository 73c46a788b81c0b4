"""Megatron-LM's own training loop (``pretrain_gpt.py``, unmodified) stopped by slurmrt's reasons.

Megatron-LM already knows how to stop every rank at the same iteration and save: ``--exit-signal-handler`` installs a
handler for its exit signal (SIGTERM) and all-gathers "received?" every iteration; ``--exit-duration-in-mins``
all-reduces "past the duration?" every iteration. Neither needs a patch. slurmrt reaches them from outside the loop:

- **The deadline** becomes ``--exit-duration-in-mins``, computed from the job's real end time (each requeued run
  computes its own), minus the margin and the save time (:func:`megatron_argv`).
- **A warning signal or the kill switch** (slurmrt records USR1/USR2 and polls the switch) makes
  :class:`StopBridge` send Megatron's exit signal to its own process, once; Megatron's handler takes it from
  there, on every rank at the same iteration.
- **Why the run stopped** is known afterwards: :func:`finish` gathers every rank's reasons (the kill switch is seen
  by one rank per node), adds the deadline or Slurm's own SIGTERM when Megatron exited on them, and
  ``rt.finish()`` decides the exit code and the requeue, as for a stop slurmrt agreed itself.

Megatron-LM needs GPUs: see examples/megatron/README.md for what was verified where.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from ..recovery.policy import ExitCode
from ..stop.decision import Reason

__all__ = ["StopBridge", "finish", "megatron_argv"]

logger = logging.getLogger(__name__)

#: What a rank without the job's end time passes as --exit-duration-in-mins: never on its own. Megatron all-reduces
#: the check (MAX), so the rank that knows the end time decides for all.
NEVER_MIN = 10**7


def megatron_argv(rt: Any, argv: list[str], *, wait_end_time_s: float = 30.0) -> tuple[list[str], float | None]:
    """Megatron's arguments with ``--exit-signal-handler`` and ``--exit-duration-in-mins`` from the job's end time.

    Returns (arguments, the wall time at which the duration runs out, or None). The duration counts from now; Megatron
    counts from the start of ``pretrain()``, a few seconds later, which the margin covers. A duration the user gave
    is kept when it is shorter."""
    out = list(argv)
    if "--exit-signal-handler" not in out:
        out.append("--exit-signal-handler")
    end = _end_time(rt, wait_end_time_s) if rt.options.deadline else None
    now = time.time()
    minutes = NEVER_MIN
    if end is not None:
        budget = rt.options.deadline_margin_s + rt.options.save_time_s
        minutes = max(1, int((end - now - budget) // 60))  # Megatron takes whole minutes
    if "--exit-duration-in-mins" in out:
        at = out.index("--exit-duration-in-mins")
        minutes = min(minutes, int(out[at + 1]))
        del out[at:at + 2]
    out += ["--exit-duration-in-mins", str(minutes)]
    return out, (now + minutes * 60 if minutes < NEVER_MIN else None)


def _end_time(rt: Any, wait_s: float) -> float | None:
    deadline = time.monotonic() + (wait_s if rt.rank == 0 else 0.0)  # rank 0 asks the scheduler; the others cannot
    while rt.end_time is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return rt.end_time  # type: ignore[no-any-return]


class StopBridge:
    """Sends Megatron's exit signal to this process, once, when this rank has a reason of slurmrt's to stop."""

    def __init__(self, rt: Any, *, exit_signal: signal.Signals = signal.SIGTERM, poll_s: float = 0.5) -> None:
        self.rt = rt
        self.exit_signal = exit_signal
        self.poll_s = poll_s
        self.fired: frozenset[Reason] = frozenset()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurmrt-megatron-bridge", daemon=True)

    def start(self) -> StopBridge:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            reasons = self.rt.local_reasons()
            if reasons:
                self.fired = reasons
                logger.warning("rank %d: %s: asking Megatron to save and exit (%s to this process)", self.rt.rank,
                               ", ".join(sorted(r.value for r in reasons)), self.exit_signal.name)
                os.kill(os.getpid(), self.exit_signal)
                return


def finish(rt: Any, bridge: StopBridge, *, exited_early: bool, duration_ends: float | None,
           iteration: int = -1) -> ExitCode:
    """After Megatron returned (``exited_early``: by ``sys.exit``, its early-exit path): the reasons of every rank,
    then ``rt.finish()``. Collective."""
    bridge.close()
    if exited_early:
        # Megatron agrees across ranks by itself: a rank may exit on another rank's signal before its own bridge
        # fired. So the reasons are gathered first; only when no rank had one did Megatron stop on its own
        # deadline check or on Slurm's SIGTERM, which rank 0 (the rank that knows the end time) tells apart.
        decision = rt.stopped(bridge.fired, step=iteration)
        if not decision.reasons:
            inferred: frozenset[Reason] = frozenset()
            if rt.rank == 0 and duration_ends is not None and time.time() >= duration_ends - 60:
                inferred = frozenset({Reason.DEADLINE})  # Megatron's --exit-duration-in-mins, from the end time
            elif rt.rank == 0 and rt.topology.is_slurm:
                inferred = frozenset({Reason.TERM})  # Slurm's own SIGTERM (or scancel), which Megatron took
            rt.stopped(inferred, step=iteration, term_time=time.time() if Reason.TERM in inferred else None)
    return rt.finish()  # type: ignore[no-any-return]
