"""What a run tells its log and its event log: rank 0 speaks for the job, each rank reports the signals it got."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from .. import _clock
from .._safefs import process_age
from ..checkpoint.store import SaveResult
from ..launch.slurmvars import job_nodes
from ..launch.topology import Topology
from ..record.code import what_ran
from ..record.events import Event, EventLog
from ..stop.decision import Reason, StopDecision
from ..stop.signals import SignalRecorder
from ..stop.straggler import Straggler

__all__ = ["Reporter"]

logger = logging.getLogger(__name__)


class Reporter:
    def __init__(self, events: EventLog, topology: Topology) -> None:
        self.events = events
        self.topology = topology
        self._lead = topology.rank == 0
        self.signals_reported = 0
        self._reported: set[signal.Signals] = set()  #: each signal is said and recorded once, when it first came
        self._said_start: float | None = None  # Slurm's start of this run, once said in a progress event

    def started(self, *, kill_switch: str | None, connections: str | None, experiment: str | None) -> None:
        t = self.topology
        if self._lead:
            self.events.emit(Event.INIT, mode=t.mode.value, world_size=t.world_size, nnodes=t.nnodes,
                             nodelist=list(t.nodelist), master=f"{t.master_addr}:{t.master_port}",
                             restart_count=t.restart_count, cuda_device_max_connections=connections,
                             kill_switch=kill_switch, experiment=experiment,
                             job_nodes=_job_nodes(), process_s=_process_s(), ran=what_ran())

    def new_signals(self, recorder: SignalRecorder, *, stalled: bool = False,
                    peers_ended: Callable[[], str | None] = lambda: None) -> None:
        """Report the signals ``recorder`` saw since the last call; the caller compares ``len(first_seen)`` with
        :attr:`signals_reported` first, which costs nothing. ``stalled``: they came while the training thread was
        past the watchdog's allowance: a frozen or stuck rank that Slurm woke to take its step down, as the answer
        to the hang it was part of (INFO: that recovery is at work; the hang's own lines follow). ``peers_ended``
        names the peers srun saw end: a SIGTERM then is srun taking the step down after them, the start of their
        recovery (INFO too)."""
        # A copy first: the recording handler may add to first_seen between two bytecodes of this thread.
        seen = {sig: when for sig, when in dict(recorder.first_seen).items() if sig not in self._reported}
        self._reported.update(seen)
        self.signals_reported = len(self._reported)
        # Every rank records its own signal, but only one per node waits for the disk (fsync): a signal reaches
        # every rank of a job at once, and thousands of serialised fsyncs on one shared file would come inside the
        # warning's lead time, on the training threads. Rank 0's decision event is the durable record of the stop.
        durable = self.topology.local_rank == 0
        for sig, when in seen.items():
            ended = peers_ended() if sig is signal.SIGTERM and not stalled else None
            if stalled:
                logger.info("rank %d received %s while stalled past the watchdog's allowance: Slurm takes down "
                            "the step of a hang", self.topology.rank, sig.name)
            elif ended:
                logger.info("rank %d received SIGTERM: srun takes the step down after it saw %s end",
                            self.topology.rank, ended)
            else:
                logger.warning("rank %d received %s", self.topology.rank, sig.name)
            why = {"stalled": True} if stalled else {"after": ended} if ended else {}  # why it was not a WARNING
            self.events.emit(Event.SIGNAL, durable=durable, signal=sig.name, received=when,
                             count=recorder.count.get(sig, 1), **why)

    def decision(self, decision: StopDecision, *, steps_measured: int, step_s: float | None, save_s: float | None,
                 margin_s: float, worst_step_s: float | None = None) -> None:
        if not self._lead:
            return
        names = sorted(r.value for r in decision.reasons)
        if decision.reasons == {Reason.DEADLINE} and steps_measured == 0:
            # A requeue loop that never gets anywhere: each run stops before it could measure a single step.
            left = "unknown" if decision.end_time is None else f"{decision.end_time - _clock.wall():.0f} s"
            logger.warning("the deadline stopped this run before its first measured step: the time left (%s) does "
                           "not hold the margin (%.0f s) plus a save (%.0f s). Raise --time, or lower "
                           "SLURMRT_DEADLINE_MARGIN_S / SLURMRT_SAVE_TIME_S", left, margin_s, save_s or 0.0)
        logger.warning("all ranks stop at step %d: %s%s", decision.step, ", ".join(names),
                       "" if decision.save else " (no time to save before SIGKILL)")
        self.events.emit(Event.DECISION, step=decision.step, reasons=names, save=decision.save,
                         end_time=decision.end_time, step_s=step_s, save_s=save_s, worst_step_s=worst_step_s)

    def progress(self, step: int, step_s: float | None, slurm_start: float | None = None) -> None:
        """Rank 0's step; the first report after Slurm's start of this run is known carries it (the ledger's
        start)."""
        if self._lead:
            said = {}
            if slurm_start is not None and not self._said_start:
                said["slurm_start"] = self._said_start = round(slurm_start, 3)
            # Written from should_stop(), on the training thread: no fsync (a lost sample costs nothing).
            self.events.emit(Event.PROGRESS, durable=False, step=step,
                             step_s=None if step_s is None else round(step_s, 6), **said)

    def phase(self, name: str, seconds: float) -> None:
        if self._lead:
            self.events.emit(Event.PHASE, durable=False, name=name, seconds=round(seconds, 3))

    def saved(self, result: SaveResult, *, blocking: bool, tier: str = "shared") -> None:
        if self._lead and not result.kept:  # a kept step was said and recorded when it was committed
            logger.info("checkpoint step %d committed%s: %.2f s, %d bytes", result.step,
                        " (local tier)" if tier == "local" else "", result.seconds, result.bytes)
            extra: dict[str, Any] = {"tier": tier} if tier != "shared" else {}
            if result.stall is not None:
                extra["stall"] = round(result.stall, 4)
            self.events.emit(Event.SAVE, step=result.step, seconds=round(result.seconds, 4), bytes=result.bytes,
                             blocking=blocking, path=str(result.path), started=round(result.started, 3), **extra)

    def save_skipped(self, step: int, save_s: float | None) -> None:
        if self._lead:
            logger.warning("not saving step %d: SIGTERM leaves too little time before SIGKILL (a save takes about "
                           "%.1f s); the previous checkpoint stays the latest", step, save_s or 0.0)
            self.events.emit(Event.SAVE_SKIPPED, step=step, save_s=save_s)

    def loaded(self, got: tuple[int, Any] | None, *, tier: str = "shared", from_peers: int | None = None,
               held: int | None = None, seconds: float | None = None) -> None:
        """``tier``: where the checkpoint was read; ``from_peers``: bytes the ranks received from other nodes' local
        tiers (None: no local tier); ``held``: the newest step the local tier held whole (it could serve, where the
        shared tier's was newer); ``seconds``: how long the load took (the goodput ledger's "load")."""
        if self._lead:
            extra: dict[str, Any] = {} if from_peers is None else {"tier": tier if got else None,
                                                                   "from_peers": from_peers, "local_held": held}
            if seconds is not None:
                extra["seconds"] = round(seconds, 4)
            self.events.emit(Event.RESUME if got else Event.FRESH_START, step=got[0] if got else None, **extra)

    def straggler(self, s: Straggler, *, node: str | None, action: str, step: int | None = None) -> None:
        """A straggler named (every rank names it at the same round): rank 0 records it, the straggler says so."""
        what = {"name": "", "exclude": "; it will be left out at the next restart",
                "replace": "; stopping to restart without it" if node else "; its node is unknown, not replaced"}
        text = (f"straggler: rank {s.rank} on {node or 'an unknown node'} is {s.ratio:.2f}x slower than the slowest "
                f"rank elsewhere in its timed sections ({s.slow_s * 1e3:.1f} ms against {s.others_s * 1e3:.1f} ms, "
                f"{s.cost:.0%} of a {s.step_s * 1e3:.1f} ms step){what[action]}")
        if self._lead:
            logger.warning("%s", text)
        elif s.rank == self.topology.rank:  # the straggler's own log says it too (rank 0 said it for the job)
            logger.info("%s", text)
        if self._lead:
            self.events.emit(Event.STRAGGLER, step=step, straggler=s.rank, node=node, ratio=round(s.ratio, 3),
                             cost=round(s.cost, 3), window=s.window, slow_s=round(s.slow_s, 6),
                             others_s=round(s.others_s, 6), step_s=round(s.step_s, 6), action=action)


def _job_nodes() -> int | None:
    """The allocation's node count, spares included (the goodput ledger's node-hours); None when unknown."""
    try:
        return job_nodes(os.environ)
    except ValueError:  # malformed: Slurm writes it; the launch checks judge the variables that matter
        return None


def _process_s() -> float | None:
    """How long this process ran before ``init()`` recorded it: the interpreter, the imports, the script's own
    set-up (the goodput ledger's "process start")."""
    age = process_age(os.getpid())
    return None if age is None else round(age, 3)
