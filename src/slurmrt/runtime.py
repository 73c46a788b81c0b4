"""``init()`` and the :class:`Runtime` it returns: the wiring of the parts, and the calls a training loop makes.

Each part has one job and its own module; this one only connects them. ``init()`` reads and checks the launch
(:mod:`slurmrt.launch`), builds the stop machinery (:mod:`slurmrt.stop`) and installs the process-global hooks
(:mod:`slurmrt._hooks`). The Runtime passes steps, saves and the end of the run between them; how a run ends is
:func:`slurmrt.outcome.policy.choose`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from . import _clock
from ._comm import Groups, torch_distributed
from ._errors import CheckpointError, ConfigError
from ._hooks import ProcessHooks
from .checkpoint.lease import Lease
from .checkpoint.store import CheckpointStore, PendingSave, SaveFn, SaveResult, Staged
from .hang.census import Census, CensusError
from .hang.response import HangResponse, exit_now, is_peer_failure, unhealthy
from .hang.watchdog import Activity, PhaseTimes, Watchdog
from .launch import cuda, health, preflight
from .launch.topology import Topology, from_environ, launcher_argv
from .options import Options, unknown_variables
from .outcome import policy as outcome
from .outcome.policy import ExitCode, Outcome
from .record import experiment
from .record.events import COPY_ENV, EventLog, measured_earlier, read_events, runs
from .record.report import Reporter
from .stop import killswitch
from .stop.agreement import Agreement, DistributedAgreement, LocalAgreement
from .stop.deadline import SAVE_SAFETY, Budget, EndTime
from .stop.decision import Contribution, Reason, StopDecision, contribution
from .stop.killswitch import KillSwitch, cancel_and_exit
from .stop.signals import SignalRecorder
from .stop.watcher import Watcher

__all__ = ["Runtime", "init"]

logger = logging.getLogger(__name__)


def init(**options: Any) -> Runtime:
    """Read the launch, check it, export what ``torch.distributed`` needs, install the signal recorders.

    Call it first thing in the script, before anything touches CUDA. Options: see :class:`slurmrt.Options` and the
    README's table of ``SLURMRT_*`` variables. Exits the process with code 0 when the kill switch already exists.
    """
    env = os.environ
    opts = Options.resolve(options, env)
    for name in unknown_variables(env):
        logger.warning("%s is set but slurmrt reads no such variable (misspelt?): it has no effect", name)
    topo = from_environ(env, launcher_argv=launcher_argv() if "RANK" in env else None)
    for warning in topo.warnings:
        logger.warning("%s", warning)
    node_gpus = cuda.node_gpu_count(env)
    preflight.check(topo, opts.parallel, node_gpus=node_gpus)
    preflight.check_master_port(topo)
    connections = cuda.apply(env, cuda.gpu_arch_major() if node_gpus else None, opts.parallel)

    lease = _take_lease(opts.checkpoint_dir, topo) if opts.checkpoint_dir is not None else None
    log_path = opts.event_log or (opts.checkpoint_dir / f"events-{topo.requeue_id or 'local'}.jsonl"
                                  if opts.checkpoint_dir else None)
    events = EventLog(log_path, job=topo.requeue_id, restart=topo.restart_count, rank=topo.rank,
                      copy=Path(env[COPY_ENV]) if env.get(COPY_ENV) else None)
    if opts.health_check:
        failures = health.check_node(env, checkpoint_dir=opts.checkpoint_dir, gpus=node_gpus or 0,
                                     local_rank=topo.local_rank)
        if failures:
            unhealthy(topo, opts, events, failures, nodes=[topo.hostname])
    if opts.kill_switch is not None and killswitch.exists(opts.kill_switch):
        logger.warning("kill switch %s exists: exiting at init with code 0, no requeue", opts.kill_switch)
        verdict = outcome.Verdict(Outcome.KILL_SWITCH, f"kill switch {opts.kill_switch} exists at init")
        Reporter(events, topo).exit(verdict.outcome, verdict, None, reason="kill_switch_at_init")
        raise SystemExit(int(Outcome.KILL_SWITCH.code))
    # Rank 0 stores the experiment id next to the checkpoints as the run starts; the other ranks read it on demand.
    experiment_id = experiment.establish(opts.checkpoint_dir, job=topo.requeue_id, override=opts.experiment_id) \
        if topo.rank == 0 else None
    for key, value in topo.exports().items():
        os.environ.setdefault(key, value)  # never overwrite a launcher's value (they agree: we derived ours from it)

    # Asked even with deadline=False: a SIGTERM at the end time is the time limit (requeue), not a scancel.
    end_time = EndTime(env, job_id=topo.job_id, ask=topo.rank == 0,
                       refresh_s=opts.end_time_refresh_s)
    switch = KillSwitch(opts.kill_switch) if opts.kill_switch and topo.local_rank == 0 else None
    # What the earlier runs of this job measured stands in until this run measures its own: a requeued run does not
    # start from the 30 s default save time (and skip a save that takes 2 s), nor without a step time.
    earlier = measured_earlier(log_path)  # one read of the log's tail, on every rank
    step_s, save_s = earlier.step_s, earlier.save_s
    budget = Budget(margin_s=opts.deadline_margin_s, save_time_s=save_s or opts.save_time_s,
                    kill_wait_s=opts.kill_wait_s, step_time_s=step_s)
    if step_s is not None or save_s is not None:
        logger.info("earlier runs of the job measured a step of %s s and a save of %s s", step_s, save_s)
    rt = Runtime(topo, opts, events, budget=budget, end_time=end_time, kill_switch=switch,
                 hooks=ProcessHooks(SignalRecorder(opts.signals), job_id=topo.job_id, world_size=topo.world_size),
                 connections=connections, lease=lease,
                 experiment_id=experiment_id, phases=PhaseTimes(earlier.phases))
    pollers = [p.poll for p in (switch, end_time if end_time.asks else None) if p is not None]
    if lease is not None and lease.held:
        pollers.append(lease.refresh)
    if opts.watchdog:
        pollers.append(rt.watchdog().poll)
    rt.start(Watcher(pollers, period_s=opts.kill_switch_poll_s))
    return rt


def _take_lease(directory: Path, topo: Topology) -> Lease:
    """The checkpoint directory's lease (slurmrt.checkpoint.lease): rank 0 takes it, the others check it, so that
    every rank of a job refused for another job's directory is refused at once, before any rendezvous."""
    owner = topo.requeue_id or (f"local-{topo.master_addr}:{topo.master_port}" if topo.world_size > 1
                                else f"local-{topo.hostname}-{os.getpid()}")
    lease = Lease(directory, owner=owner, job=topo.requeue_id, array_task=topo.array_task_id, host=topo.hostname)
    if topo.rank == 0:
        lease.acquire()
    else:
        lease.check()
    return lease


class Runtime:
    """Returned by :func:`slurmrt.init`. Topology attributes, then the training-loop calls."""

    def __init__(self, topology: Topology, options: Options, events: EventLog, *, budget: Budget, end_time: EndTime,
                 kill_switch: KillSwitch | None, hooks: ProcessHooks, connections: str | None = None,
                 experiment_id: str | None = None, phases: PhaseTimes | None = None,
                 lease: Lease | None = None) -> None:
        self.topology, self.options, self.events = topology, options, events
        self._lease = lease
        self.cuda_device_max_connections = connections
        self._report = Reporter(events, topology)
        self._budget, self._steps, self._end = budget, budget.steps, end_time
        self._switch, self._hooks, self._signals = kill_switch, hooks, hooks.signals
        self._last_tick: float | None = None
        self.heartbeat = _clock.mono()  #: monotonic time of the last step boundary
        self._experiment_id = experiment_id
        #: The step of the checkpoint load_latest() resumed from; None before it, or on a fresh start.
        self.resumed_step: int | None = None
        self.loaded = False  #: True once load_latest() was called
        #: This rank's ``local`` state of the checkpoint load_latest() resumed from; None if none was saved, or if
        #: it could not be restored (another world size: a warning says so).
        self.local_state: Any = None
        # Rank 0 records its progress at the first step, then every progress_s; never, on the other ranks.
        self._next_progress = 0.0 if topology.rank == 0 and options.progress_s is not None else float("inf")
        self._agreement: Agreement | None = None
        self._store: CheckpointStore | None = None
        self._background: PendingSave | None = None
        self._decision: StopDecision | None = None
        self.outcome: Outcome | None = None  #: how the run ended, once finish() decided
        self._closed = False
        self._watcher: Watcher | None = None
        self._phases = phases or PhaseTimes()
        #: What the training thread does (the watchdog's view); changed at saves, loads and phases, not per step.
        #: None until the first should_stop: a program that never reports steps (Megatron-LM's own loop behind
        #: the bridge) is not watched between them, only in its saves, loads and phases.
        self.activity: Activity | None = None
        self._census: Census | None | bool = False  # False: not made yet
        self._registered = False
        self._response: HangResponse | None = None

    def watchdog(self) -> Watchdog:
        """The hang watchdog of this run (init() polls it on the watcher thread; see slurmrt.hang.watchdog)."""
        o = self.options
        self._response = HangResponse(
            self.topology, o, self.events, kill_switch_seen=self._kill_switch_seen,
            last_step=lambda: self._agreement.last_step if self._agreement is not None else None,
            census=self._run_census, census_wait_s=max(10.0, 3 * o.kill_switch_poll_s),
            terminating=lambda: signal.SIGTERM in self._signals.first_seen,
            cancel=functools.partial(cancel_and_exit, o.kill_switch, self.topology.requeue_id)
            if o.kill_switch else None)
        self._hooks.on_uncaught = self._uncaught
        return Watchdog(self._budget, self._phases, heartbeat=lambda: self.heartbeat, activity=lambda: self.activity,
                        on_hang=self._response.hung, floor_s=o.hang_floor_s, startup_s=o.startup_timeout_s,
                        fixed_s=o.hang_timeout_s, probe=self._probe)

    def _kill_switch_seen(self) -> bool:
        if self._switch is not None and self._switch.seen is not None:
            return True
        decision = self._agreement.decision if self._agreement is not None else None
        return decision is not None and Reason.KILL_SWITCH in decision.reasons

    def _run_census(self) -> Census | None:
        """This run's census (in the store of torch.distributed's default group); None for one process."""
        if self._census is False:
            self._census = None
            dist = torch_distributed()
            if self.world_size > 1 and dist is not None and dist.is_available() and dist.is_initialized():
                try:
                    store = dist.distributed_c10d._get_default_store()
                except Exception as err:  # noqa: BLE001 - a private API: without it, no census
                    logger.warning("no rendezvous store for the hang census: %s", err)
                    store = None
                if store is not None:
                    t = self.topology
                    self._census = Census(store, prefix=f"slurmrt/{t.requeue_id or 'local'}/{t.restart_count}/",
                                          rank=t.rank, world=t.world_size)
        return self._census if isinstance(self._census, Census) else None

    def _probe(self, idle_s: float) -> None:
        """The training thread is stalled: did another rank find the job hung? Then answer its census, and exit."""
        census = self._run_census()
        try:
            opened = census is not None and census.is_open()
        except CensusError:
            return  # this rank's own watchdog acts when its allowance runs out
        if opened and self._response is not None:
            self._response.joined(idle_s)

    def _uncaught(self, err: BaseException | None) -> None:
        """The program ends on ``err``: when it says a peer is gone, name the peer and requeue without its node."""
        if self._response is None or self.world_size == 1 or err is None:
            return
        if is_peer_failure(err):
            self._response.lost_peer(err)
        self._response.crashed(err)

    def _groups(self) -> Groups:
        groups = self._hooks.groups()
        if not self._registered:
            self._registered = True
            census = self._run_census()
            if census is not None:
                try:
                    census.register(self.topology.hostname)
                except CensusError as err:
                    logger.warning("%s", err)
            if self.options.health_check and groups.control is not None:
                self._barrier_check(groups.control, census)
        return groups

    def _barrier_check(self, group: Any, census: Census | None) -> None:
        """The health check's communication part: a barrier over every rank that must pass within the floor."""
        import datetime

        import torch.distributed as dist

        try:
            dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=self.options.hang_floor_s),
                                   wait_all_ranks=True)
        except RuntimeError as err:
            # Rank 0 learns which ranks did not come ("Ranks 1, 3 failed to pass monitoredBarrier"); the others
            # only that rank 0 gave up.
            found = re.search(r"Ranks? ([\d, ]+) failed", str(err))
            ranks = [int(r) for r in re.findall(r"\d+", found.group(1))] if found else []
            nodes: list[str] = []
            if ranks and census is not None:
                with contextlib.suppress(CensusError):
                    nodes = sorted(set(census.nodes(ranks).values()))
            failures = [f"the start-up barrier did not complete in {self.options.hang_floor_s:.0f} s: {err}"]
            if self.rank == 0:
                unhealthy(self.topology, self.options, self.events, failures, nodes=nodes)
            exit_now(ExitCode.UNHEALTHY)

    @contextlib.contextmanager
    def _doing(self, kind: str) -> Iterator[None]:
        """The training thread is in a save or a load: the watchdog gives it a save's allowance."""
        outer = self.activity
        self.activity = Activity(kind, _clock.mono())
        try:
            yield
        finally:
            self.activity = outer.resumed(_clock.mono()) if outer else None

    @contextlib.contextmanager
    def phase(self, name: str, *, timeout_s: float | None = None) -> Iterator[None]:
        """Mark a phase that is slow on every rank (an evaluation, the first compile, a data reshuffle).

        The watchdog gives it ``timeout_s``, or 3x its longest measured duration (this run's or an earlier run's;
        never less than ``hang_floor_s``; ``startup_timeout_s`` until measured). Its time is not step time. A stop
        that comes during the phase is acted on at the next ``should_stop``, after it; ``should_stop(step,
        before=name)`` stops before the phase when its measured duration and a save no longer fit before the end.
        """
        outer = self.activity
        start = _clock.mono()
        self.activity = Activity("phase", start, name, timeout_s)
        ok = False
        try:
            yield
            ok = True
        finally:
            seconds = _clock.mono() - start
            if ok:
                self._phases.add(name, seconds)
                self._report.phase(name, seconds)
            self.activity = outer.resumed(_clock.mono()) if outer else None
            self.restart_step_clock()

    def start(self, watcher: Watcher) -> None:
        """Install the process-global hooks and start ``watcher``; init() calls it."""
        self._hooks.install()
        self._watcher = watcher
        watcher.start()
        switch = self.options.kill_switch
        self._report.started(kill_switch=str(switch.resolve()) if switch else None,
                             connections=self.cuda_device_max_connections, experiment=self._experiment_id)

    # -- topology --------------------------------------------------------------------------------------------------
    rank = property(lambda self: self.topology.rank)
    local_rank = property(lambda self: self.topology.local_rank)
    node_rank = property(lambda self: self.topology.node_rank)
    world_size = property(lambda self: self.topology.world_size)
    local_world_size = property(lambda self: self.topology.local_world_size)
    nnodes = property(lambda self: self.topology.nnodes)
    master_addr = property(lambda self: self.topology.master_addr)
    master_port = property(lambda self: self.topology.master_port)
    job_id = property(lambda self: self.topology.job_id)
    restart_count = property(lambda self: self.topology.restart_count)

    @property
    def experiment_id(self) -> str:
        """The same for every run of the job, across requeues: stored in ``experiment.json`` next to the checkpoints
        (new for a fresh checkpoint directory; ``experiment_id=`` overrides it). Without a checkpoint directory it
        cannot outlive the process, and ranks other than 0 each get their own."""
        if self._experiment_id is None:
            self._experiment_id = experiment.establish(self.options.checkpoint_dir, job=self.topology.requeue_id,
                                                       override=self.options.experiment_id)
        return self._experiment_id

    def __repr__(self) -> str:
        t = self.topology
        return (f"Runtime(mode={t.mode.value}, rank={t.rank}/{t.world_size}, local_rank={t.local_rank}/"
                f"{t.local_world_size}, node={t.node_rank}/{t.nnodes}, master={t.master_addr}:{t.master_port}, "
                f"job={t.job_id}, restart={t.restart_count})")

    # -- stopping --------------------------------------------------------------------------------------------------
    def should_stop(self, step: int, *, before: str | None = None) -> bool:
        """True when the job must stop after ``step``: the same answer on every rank, at the same step.

        Cheap: a clock read and a comparison on most steps; this thread never waits for a collective of its own.
        The first call after ``init_process_group`` creates slurmrt's two gloo groups, which every rank does at the
        same point of its program (so do ``save`` and ``load_latest``, whichever comes first).

        ``before="eval"``: the loop enters that phase (:meth:`phase`) after this step. The ranks then also agree
        (a collective: every rank passes the same ``before`` at the same step) whether its measured duration, a
        save and the margin still fit before the job's end, and stop here if not.
        """
        now = _clock.mono()
        if self._last_tick is not None:
            self._steps.add(now - self._last_tick)
        self.heartbeat = now
        if now >= self._next_progress:
            self._progress(step, now)
        if self._background is not None and self._background.done():
            self._collect()
        if len(self._signals.first_seen) != self._report.signals_reported:  # no call on the per-step path
            self._report.new_signals(self._signals)
        agreement = self._agreement or self._start_agreement()
        stop = agreement.should_stop(step)
        if stop and self._decision is None:
            assert agreement.decision is not None
            self._on_decision(agreement.decision)
        if before is not None and not stop:
            stop = self._phase_unfit(before, step)
        # The step clock restarts when this call returns: a wait for the agreement is not step time. Counting it
        # made slow rounds look like slow steps, which shrank the window and made training wait again.
        self._last_tick = _clock.mono()
        return stop

    def _phase_unfit(self, name: str, step: int) -> bool:
        """Agree whether phase ``name`` still fits before the end (see should_stop); True: stop at ``step``."""
        phase_s, end = self._phases.get(name), self.end_time
        unfit = False
        if phase_s is not None and end is not None and self.options.deadline:
            save_s = self._budget.saves.estimate() or 0.0
            unfit = _clock.wall() + phase_s + SAVE_SAFETY * save_s + self.options.deadline_margin_s >= end
        if self._background is not None:
            self._collect()  # the work group is the background save's until it is done
        if self._groups().work.all_ok(not unfit):
            return False
        if self._decision is None:
            logger.warning("phase %r (%.0f s measured) no longer fits before the end: stopping before it", name,
                           phase_s or 0.0)
            self._on_decision(StopDecision(step, frozenset({Reason.DEADLINE}), True, end, None))
        return True

    def _progress(self, step: int, now: float) -> None:
        assert self.options.progress_s is not None
        self._next_progress = now + self.options.progress_s
        self._report.progress(step, self._steps.estimate())

    def restart_step_clock(self) -> None:
        """The time since the last step boundary was not a training step (an evaluation, a framework's own save):
        leave it out of the measured step time, which the deadline relies on."""
        self._last_tick = None
        self.heartbeat = _clock.mono()

    def reclaim_signals(self) -> None:
        """Put slurmrt's signal recorders back where a framework replaced them with handlers of its own (Lightning
        installs a SIGTERM handler at the start of ``fit``). Call it on the main thread, after the framework's set-up.
        """
        taken = self._signals.reclaim()
        if taken:
            logger.info("slurmrt's handlers for %s are back in place", ", ".join(s.name for s in taken))

    def local_reasons(self) -> frozenset[Reason]:
        """This rank's own reasons to stop, not agreed with the others: the signals it recorded and the kill switch
        (when this rank polls it). For a framework that agrees on the stop by itself (Megatron-LM's exit signal
        handler): see :mod:`slurmrt.integrations.megatron`."""
        c = contribution(now=_clock.wall(), step=0, steps_ahead=0, signals=dict(self._signals.first_seen),
                         kill_switch_seen=self._switch is not None and self._switch.seen is not None,
                         own_end=self._end.value, agreed_end=None, budget=self._budget, deadline=False)
        return c.reasons

    def stopped(self, reasons: frozenset[Reason], *, step: int, term_time: float | None = None) -> StopDecision:
        """A framework's own mechanism stopped every rank at ``step``; ``reasons`` are this rank's. Collective: the
        ranks exchange their reasons, and :meth:`finish` then decides the exit code and the requeue from the union,
        as for a stop slurmrt agreed itself."""
        gathered = self._groups().work.all_gather((sorted(r.value for r in reasons), term_time))
        union = frozenset(Reason(v) for values, _ in gathered for v in values)
        terms = [t for _, t in gathered if t is not None]
        decision = StopDecision(step, union, True, self.end_time, min(terms) if terms else None)
        if union:
            self._on_decision(decision)
        return decision

    @property
    def end_time(self) -> float | None:
        """The job's end time (epoch seconds) as far as this rank knows it; None without a limit or before the
        scheduler answered."""
        return self._end.value or (self._agreement.end_time if self._agreement is not None else None)

    @property
    def stop_decision(self) -> StopDecision | None:
        return self._decision

    @property
    def stop_reason(self) -> Reason | None:
        """The most final reason of the agreed stop, or None while running."""
        return self._decision.reason if self._decision is not None else None

    def _start_agreement(self) -> Agreement:
        self.activity = Activity("step", _clock.mono())  # the first step boundary: the start is over
        groups = self._groups()
        if groups.control is None:
            self._agreement = LocalAgreement(self._contribute)
        else:
            self._agreement = DistributedAgreement(self._contribute, groups.control, step_estimate=self._steps.estimate)
            self._hooks.watch(self._agreement)
        return self._agreement

    def _contribute(self, step: int, steps_ahead: int, agreed_end: float | None) -> Contribution:
        """This rank's view, read by the agreement (its thread, or the training thread for one process)."""
        return contribution(now=_clock.wall(), step=step, steps_ahead=steps_ahead,
                            signals=dict(self._signals.first_seen),
                            kill_switch_seen=self._switch is not None and self._switch.seen is not None,
                            own_end=self._end.value, agreed_end=agreed_end, budget=self._budget,
                            deadline=self.options.deadline)

    def _on_decision(self, decision: StopDecision) -> None:
        self._decision = decision
        self._report.decision(decision, steps_measured=len(self._steps), step_s=self._steps.estimate(),
                              save_s=self._budget.saves.estimate(), margin_s=self.options.deadline_margin_s)

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def _get_store(self) -> CheckpointStore:
        if self._store is None:
            if self.options.checkpoint_dir is None:
                raise ConfigError(
                    "save() and load_latest() need a checkpoint directory: pass slurmrt.init(checkpoint_dir=...) or "
                    "set SLURMRT_CHECKPOINT_DIR (a path every node sees)",
                )
            token = f"{self.topology.requeue_id or 'local'}-r{self.restart_count}".replace("/", "_")
            self._store = CheckpointStore(self.options.checkpoint_dir, self._groups().work,
                                          keep_last=self.options.keep_last, keep_every=self.options.keep_every,
                                          token=token, threads=self.options.save_threads,
                                          guard=self._lease.guard if self._lease is not None else None)
        if self._background is not None:
            self._collect()  # the store waits for it anyway; take its result first
        return self._store

    def save(self, state: dict[str, Any] | SaveFn | Staged, *, step: int, blocking: bool = True,
             local: Any = None) -> bool:
        """Checkpoint ``state`` as ``step``: a dict of sharded state (DTensor: saved with DCP, resumable on another
        world size), this rank's dict (a DDP model's), or a function writing into a directory. ``local`` is this
        rank's own state (RNG states, data position), given back on the same rank by :attr:`local_state`.

        Collective: every rank calls it with the same step. After a stop, saves are blocking, and are skipped (False)
        when SIGTERM left less time than the measured save takes -- better a clean exit than a SIGKILL mid-write.
        """
        decision = self._decision
        if decision is not None and not decision.save:
            self._report.save_skipped(step, self._budget.saves.estimate())
            return False
        with self._doing("save"):
            got = self._get_store().save(state, step, blocking=blocking or decision is not None, local=local)
        if isinstance(got, PendingSave):
            self._background = got
        else:
            self._saved(got, blocking=True)
        self.restart_step_clock()  # a save between two steps is not step time
        return True

    def _collect(self) -> None:
        """Take the background save's result (waiting for it if needed). Its error stays with the store, which
        raises it at its next call: the next save, load_latest() or finish()."""
        pending, self._background = self._background, None
        if pending is not None:
            with contextlib.suppress(CheckpointError):
                self._saved(pending.wait(), blocking=False)

    def _wait_for_saves(self) -> bool:
        """Wait for a background save, if any; False when it failed (logged here)."""
        if self._store is None:
            return True
        try:
            self._get_store().wait()
        except CheckpointError as err:
            logger.error("the last background checkpoint failed: %s", err)
            return False
        return True

    def _saved(self, result: SaveResult, *, blocking: bool) -> None:
        self._budget.save_done(result.seconds, started=result.started, periodic=self._decision is None)
        self._report.saved(result, blocking=blocking)

    def load_latest(self, *, into: dict[str, Any] | None = None, verify: bool = True) -> tuple[int, Any] | None:
        """(step, state) of the newest sound checkpoint, the same one on every rank; None on a fresh start.

        For sharded state, ``into`` is this run's state dict (sharded as this run shards it, with the keys of the
        save): it is loaded in place, resharded, and returned as ``state``. ``verify`` checks every file's checksum
        (the ranks share the reading); a checkpoint that fails is skipped with a warning naming the file.
        """
        with self._doing("load"):
            got = self._get_store().load_latest(into=into, verify=verify)
        self.resumed_step = got.step if got is not None else None
        self.local_state = got.local if got is not None else None
        if got is not None and got.local_lost is not None:
            logger.warning("rank %d: %s", self.rank, got.local_lost)
        self.loaded = True
        result = (got.step, got.state) if got is not None else None
        self._report.loaded(result)
        return result

    # -- the end ---------------------------------------------------------------------------------------------------
    def _futile_runs(self) -> int:
        """Runs in a row, this one included, that committed no newer checkpoint (rank 0 reads the event log; the
        outcome is rank 0's)."""
        path = self.events.path
        if self.rank != 0 or path is None or not path.exists() or self._decision is None:
            return 0
        return outcome.futile_runs(runs(read_events(path)))

    def finish(self) -> ExitCode:
        """Wait for saves, decide how the run ends, requeue if so, then close(). Every rank returns rank 0's outcome:
        the others wait for it while rank 0 requeues."""
        if self._closed:
            raise RuntimeError("finish() or exit() was already called")
        self.activity = Activity("save", _clock.mono())  # waits for saves and for the other ranks
        failed_save = not self._wait_for_saves()
        if self._agreement is not None:
            self._agreement.end_rounds()
        comm = self._groups().work
        verdict = outcome.choose(self._decision, requeue_enabled=self.options.requeue, is_slurm=self.topology.is_slurm,
                                 restart_count=self.restart_count, max_restarts=self.options.max_restarts,
                                 kill_switch=self.options.kill_switch, futile=self._futile_runs(),
                                 max_futile=self.options.max_futile_runs)
        chosen = outcome.after_failed_save(verdict.outcome) if failed_save else verdict.outcome
        self._report.exit(chosen, verdict, self._decision)
        # Every rank is past its saves; the others now wait in the broadcast below while rank 0 requeues. Slurm
        # ends every task of the job when it requeues it, and a rank that exited first with a non-zero code would
        # make `srun --kill-on-bad-exit` kill rank 0 before its requeue: so nobody leaves before the requeue.
        comm.all_ok(True)
        if comm.rank == 0 and verdict.requeue and self.topology.requeue_id:
            done, message = outcome.requeue(self.topology.requeue_id)
            self._report.requeue(done, message)
            chosen = chosen if done else Outcome.REQUEUE_NEEDED
        self.outcome = Outcome[comm.broadcast(chosen.name)]
        self.close()
        return self.outcome.code

    def exit(self) -> NoReturn:
        """:meth:`finish`, destroy the default process group if any, then ``sys.exit`` with the code.

        See :class:`slurmrt.ExitCode` for the codes. Destroying the group here spares the "process group was not
        destroyed" warning and NCCL's teardown hangs at interpreter exit; exit() ends the program anyway.
        """
        code = self.finish()
        dist = torch_distributed()
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(int(code))

    def close(self) -> None:
        """Stop the background threads (a background save is waited for) and undo the process-global hooks, without
        deciding anything (finish() calls it). Collective when torch.distributed is in use: it ends the agreement
        rounds, and the save, which every rank takes part in."""
        if self._closed:
            return
        self._closed = True
        self.activity = None  # the watchdog stands down
        if self._agreement is not None:
            self._agreement.end_rounds()
        if self._watcher is not None:
            self._watcher.stop()
        # A background save still in flight is the user's checkpoint, and its thread is inside a collective: the
        # interpreter must not end under it (gloo aborts the process). Let it commit.
        self._wait_for_saves()
        # After a failed round a peer is probably gone: destroying the groups could wait for it.
        self._hooks.undo(destroy_groups=self._agreement is None or not self._agreement.failed)
        if self._lease is not None:
            self._lease.release()  # the next task of an --array=...%1 chain may take the directory now
