"""The parts of one run, built once by :func:`build_run` from the options and the executor, in dependency order: the
process hooks, the checkpoint session, the save cadence, the hang monitor, the stop controller, the watcher thread
that polls them, and the training's health check. The :class:`~slurmrt.runtime.facade.Runtime` forwards the
training loop's calls to them; the in-process restart (:mod:`slurmrt.runtime.inprocess`) puts them back to their
state before a first step with :meth:`RunParts.abort` and :meth:`RunParts.restart`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..checkpoint import lease as leases
from ..checkpoint.cadence import Cadence
from ..checkpoint.session import CheckpointSession
from ..checkpoint.settings import CheckpointSection
from ..hang.monitor import HangMonitor
from ..hang.settings import HangSection
from ..health.check import FLIP_ENV, REHEARSE_ENV, SPIKE_ENV, HealthCheck, rehearsal
from ..health.settings import HealthSection
from ..launch.topology import Topology
from ..options import Options
from ..record.runs import measured_earlier
from ..recovery.executor import Executor
from ..recovery.word import listen
from ..stop.controller import StopController
from ..stop.deadline import Budget
from ..stop.killswitch import KillSwitch
from ..stop.settings import StopSection
from ..stop.signals import SignalRecorder
from ..stop.state import PhaseTimes, RunState
from ..stop.watcher import Watcher
from .hooks import ProcessHooks
from .report import Reporter

__all__ = ["RunParts", "build_run"]


@dataclass
class RunParts:
    """What one run is made of (each stands alone; :func:`build_run` wires them)."""

    executor: Executor
    report: Reporter
    hooks: ProcessHooks
    checkpoints: CheckpointSession
    cadence: Cadence
    state: RunState  #: what the stop controller writes and the hang monitor reads
    hangs: HangMonitor
    stop: StopController
    switch: KillSwitch | None
    watcher: Watcher
    health: HealthCheck

    def abort(self) -> None:
        """A rank's training raised under ``run_restartable``: the agreement leaves its round and slurmrt's groups
        are aborted, so that a peer waiting on this rank fails at once instead of waiting."""
        self.stop.restart()
        self.hooks.drop_groups()

    def restart(self, generation: int) -> None:
        """Every rank is back for ``generation``: the parts start again as at a first step, the saves in directories
        of their own (the next collective opens new groups on the new default group)."""
        self.checkpoints.restart(generation)
        self.hangs.restart()
        self.cadence.restart()


def build_run(topology: Topology, options: Options, executor: Executor, *,
              lease: leases.Lease | None = None) -> RunParts:
    """The parts of this run, each from its own settings and its collaborators."""
    events, env = executor.events, os.environ
    report = Reporter(events, topology)
    # Asked even with deadline=False: a SIGTERM at the end time is the time limit (requeue), not a scancel.
    signals = SignalRecorder(options.signals)  # and rank 0 hears slurmrt run's word: its signals, the job's times
    end_time, word = listen(executor.facts.in_job, signals.record, env, job_id=topology.job_id,
                            lead=topology.rank == 0, refresh_s=options.end_time_refresh_s)
    switch = KillSwitch(options.kill_switch) if options.kill_switch and topology.local_rank == 0 else None
    earlier = measured_earlier(events.path)  # one read of the log's tail, on every rank
    budget = Budget.from_options(margin_s=options.deadline_margin_s, save_time_s=options.save_time_s,
                                 kill_wait_s=options.kill_wait_s, measured_step_s=earlier.step_s,
                                 measured_save_s=earlier.save_s)
    hooks = ProcessHooks(signals, job_id=topology.job_id, world_size=topology.world_size)
    checkpoints = CheckpointSession(CheckpointSection.of(options), report, budget, token=_token(topology),
                                    work=lambda: hooks.groups().work,
                                    guard=lease.guard if lease is not None else None,
                                    node=topology.hostname, per_node=topology.local_world_size,
                                    lead=topology.local_rank == 0)
    cadence = Cadence(rank=topology.rank, comm=lambda: hooks.groups().work, events=events.path,
                      current=(topology.restart_count, topology.attempt), nodes=topology.nnodes,
                      node_h=options.mtbf_node_h, local=options.local_checkpoint_dir is not None,
                      step_s=budget.steps.estimate, stalls=earlier.stalls,
                      join=checkpoints.settle, writes=checkpoints.writes, written=earlier.save_s)
    state = RunState()
    hangs = HangMonitor(topology, HangSection.of(options), executor, state=state, signals=signals,
                        kill_switch=switch, watch_interval_s=options.watch_interval_s)
    stop = StopController(topology, StopSection.of(options), report, state=state, budget=budget, end_time=end_time,
                          signals=signals, kill_switch=switch, phases=PhaseTimes(earlier.phases), collectives=hooks,
                          saves=checkpoints, nodes=hangs, recovery=executor)
    hooks.on_groups = hangs.first_collective
    pollers = [p.poll for p in (switch, end_time if end_time.asks else None, word) if p is not None]
    if lease is not None and lease.held:
        pollers.append(lease.refresh)
    if options.watchdog:
        hooks.on_uncaught = hangs.uncaught
        pollers.append(hangs.watchdog(budget, stop.phases).poll)
    watcher = Watcher(pollers, period_s=options.watch_interval_s)
    health = HealthCheck(HealthSection.of(options), events, rank=topology.rank, world_size=topology.world_size,
                         directory=options.checkpoint_dir, rehearse=rehearsal(env.get(REHEARSE_ENV)),
                         flip=_first(rehearsal(env.get(FLIP_ENV), FLIP_ENV)),
                         spike=_first(rehearsal(env.get(SPIKE_ENV), SPIKE_ENV)),
                         on_certified=checkpoints.keep_certified, on_rewind=checkpoints.set_aside,
                         node_of=_node_of(topology, hangs),
                         on_transient=stop.leave_out)
    return RunParts(executor, report, hooks, checkpoints, cadence, state, hangs, stop, switch, watcher, health)


def _node_of(topology: Topology, hangs: HangMonitor) -> Callable[[int], str | None]:
    """The node of a rank: the census's (which one process has none of: its own)."""
    return (lambda rank: topology.hostname) if topology.world_size == 1 else hangs.node_of


def _first(rehearsed: tuple[int, bool] | None) -> int | None:
    """The step of a rehearsed flip or spike (``slurmrt sim``), or None."""
    return rehearsed[0] if rehearsed is not None else None


def _token(topology: Topology) -> str:
    """The name of this run's temporary checkpoint directories: no earlier run or attempt of the job used it."""
    token = f"{topology.requeue_id or 'local'}-r{topology.restart_count}" + \
        (f"-a{topology.attempt}" if topology.attempt else "")
    return token.replace("/", "_")
