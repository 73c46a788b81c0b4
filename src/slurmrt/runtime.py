"""The object a training script talks to: topology, stop decisions, checkpoints, exit."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from . import _clock, cuda, preflight
from ._errors import CheckpointError, ConfigError
from .agreement import Contribution, DistributedAgreement, LocalAgreement, Reason, StopDecision
from .checkpoint import CheckpointStore, SaveFn, SaveResult
from .comm import Comm, GlooComm, SoloComm
from .deadline import DurationEstimator, PeriodicSaves, budget_saves, end_time_from_env, query_end_time, time_is_short
from .events import COPY_ENV, EventLog
from .options import Options
from .registry import register_process, unregister_process
from .requeue import ExitCode, requeue
from .signals import SignalRecorder
from .topology import Topology, from_environ, launcher_argv
from .watcher import Watcher

__all__ = ["Runtime", "init"]

logger = logging.getLogger(__name__)

#: A SIGTERM within this many seconds of the end time (or after it) is the time limit, not scancel/preemption.
TIME_LIMIT_TOLERANCE_S = 15.0


def init(**options: Any) -> Runtime:
    """Read the launch, check it, export what ``torch.distributed`` needs, install the signal recorders.

    Call it first thing in the script, before anything touches CUDA. Options: see :class:`slurmrt.Options` and the
    README's table of ``SLURMRT_*`` variables. Exits the process with code 0 when the kill switch already exists.
    """
    env = os.environ
    opts = Options.resolve(options, env)
    topo = from_environ(env, launcher_argv=launcher_argv() if "RANK" in env else None)
    for warning in topo.warnings:
        logger.warning("%s", warning)

    parallel = cuda.ParallelConfig(tp=opts.tp, pp=opts.pp, cp=opts.cp, fsdp=opts.fsdp, moe_overlap=opts.moe_overlap)
    if opts.megatron_args is not None:
        parallel = cuda.parse_megatron_args(opts.megatron_args)
    declared = preflight.declared_from(env, nnodes=opts.nnodes, gpus_per_node=opts.gpus_per_node, tp=parallel.tp,
                                       pp=parallel.pp, cp=parallel.cp)
    node_gpus = cuda.node_gpu_count(env)
    preflight.check(topo, declared, node_gpus=node_gpus)
    arch = cuda.gpu_arch_major() if node_gpus else None
    connections = cuda.apply(env, arch, parallel)

    events = EventLog(_event_log_path(opts, topo), job=topo.requeue_id, restart=topo.restart_count, rank=topo.rank,
                      copy=Path(env[COPY_ENV]) if env.get(COPY_ENV) else None)
    if opts.kill_switch is not None and opts.kill_switch.exists():
        logger.warning("kill switch %s exists: exiting at init with code 0, no requeue", opts.kill_switch)
        if topo.rank == 0:
            events.emit("exit", code=int(ExitCode.KILL_SWITCH), reason="kill_switch_at_init")
        raise SystemExit(int(ExitCode.KILL_SWITCH))

    for key, value in topo.exports().items():
        os.environ.setdefault(key, value)  # never overwrite a launcher's value (they agree: we derived ours from it)
    return Runtime(topo, opts, events, env, connections=connections)


def _event_log_path(opts: Options, topo: Topology) -> Path | None:
    if opts.event_log is not None:
        return opts.event_log
    if opts.checkpoint_dir is None:
        return None
    return opts.checkpoint_dir / f"events-{topo.requeue_id or 'local'}.jsonl"


class Runtime:
    """Returned by :func:`slurmrt.init`. Topology attributes, then the training-loop calls."""

    def __init__(self, topology: Topology, options: Options, events: EventLog, env: Mapping[str, str], *,
                 connections: str | None = None) -> None:
        self.topology = topology
        self.options = options
        self.events = events
        self.cuda_device_max_connections = connections
        self._env_end_time = end_time_from_env(env)
        self._steps = DurationEstimator(window=64, skip=2, quantile=0.95)
        self._saves = DurationEstimator(window=4, quantile=1.0, default=options.save_time_s)
        self._periodic = PeriodicSaves()
        self._last_tick: float | None = None
        self._heartbeat = _clock.mono()
        self._signals = SignalRecorder(options.signals)
        if not self._signals.install():
            logger.warning("slurmrt.init() was called outside the main thread: signals are not handled")
        self._signals_logged = 0
        self._agreement: LocalAgreement | DistributedAgreement | None = None
        self._comm: Comm | None = None
        self._store: CheckpointStore | None = None
        self._decision: StopDecision | None = None
        self._closed = False
        t = topology
        poll_here = options.kill_switch is not None and t.local_rank == 0
        self._watcher = Watcher(
            kill_switch=options.kill_switch if poll_here else None,
            poll_s=options.kill_switch_poll_s,
            job_id=t.job_id,
            query_end_time=options.deadline and t.rank == 0 and self._env_end_time is None,
            end_time_refresh_s=options.end_time_refresh_s,
            fetch_end_time=query_end_time,
            heartbeat=lambda: self._heartbeat,
            hang_timeout_s=options.hang_timeout_s,
            cancel_id=t.requeue_id,
        )
        self._watcher.start()
        self._registration = register_process(t.job_id)
        if t.rank == 0:
            events.emit("init", mode=t.mode.value, world_size=t.world_size, nnodes=t.nnodes, nodelist=list(t.nodelist),
                        master=f"{t.master_addr}:{t.master_port}", restart_count=t.restart_count,
                        cuda_device_max_connections=connections,
                        kill_switch=str(options.kill_switch.resolve()) if options.kill_switch else None)

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

    def __repr__(self) -> str:
        t = self.topology
        return (f"Runtime(mode={t.mode.value}, rank={t.rank}/{t.world_size}, local_rank={t.local_rank}/"
                f"{t.local_world_size}, node={t.node_rank}/{t.nnodes}, master={t.master_addr}:{t.master_port}, "
                f"job={t.job_id}, restart={t.restart_count})")

    # -- stopping --------------------------------------------------------------------------------------------------
    def should_stop(self, step: int) -> bool:
        """True when the job must stop after ``step``: the same answer on every rank, at the same step.

        Cheap: a clock read and a comparison on most steps; never a collective on this thread.
        """
        now = _clock.mono()
        if self._last_tick is not None:
            self._steps.add(now - self._last_tick)
        self._heartbeat = now
        if len(self._signals.first_seen) != self._signals_logged:
            self._log_signals()
        agreement = self._agreement or self._start_agreement()
        stop = agreement.should_stop(step)
        if stop and self._decision is None:
            assert agreement.decision is not None
            self._on_decision(agreement.decision)
        # The step clock restarts when this call returns: a wait for the agreement is not step time. Counting it
        # made slow rounds look like slow steps, which shrank the window and made training wait again.
        self._last_tick = _clock.mono()
        return stop

    @property
    def end_time(self) -> float | None:
        """The job's end time (epoch seconds) as far as this rank knows it; None without a limit or before the
        scheduler answered."""
        agreed = self._agreement.end_time if self._agreement is not None else None
        return self._env_end_time or self._watcher.end_time or agreed

    @property
    def stop_decision(self) -> StopDecision | None:
        return self._decision

    @property
    def stop_reason(self) -> Reason | None:
        """The most final reason of the agreed stop, or None while running."""
        return self._decision.reason if self._decision is not None else None

    def _start_agreement(self) -> LocalAgreement | DistributedAgreement:
        comm = self._get_comm()
        if isinstance(comm, GlooComm):
            self._agreement = DistributedAgreement(self._contribute, self._control_group,
                                                   step_estimate=self._steps.estimate)
        else:
            self._agreement = LocalAgreement(self._contribute)
        return self._agreement

    def _get_comm(self) -> Comm:
        """The collectives for checkpoints; creates both gloo groups the first time (collectively: every rank gets
        here in the same program order, at its first should_stop, save or load_latest)."""
        if self._comm is not None:
            return self._comm
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Two groups: one for the agreement thread, one for the training thread (saves, loads, exit). Sharing
            # one group between threads could pair different collectives on different ranks.
            self._control_group = dist.new_group(backend="gloo")
            coord = dist.new_group(backend="gloo")
            self._comm = GlooComm(coord, dist.get_rank(), dist.get_world_size())
        else:
            self._comm = SoloComm()
        return self._comm

    def _contribute(self, step: int, steps_ahead: int, agreed_end: float | None) -> Contribution:
        """This rank's view: read by the agreement (its thread, or the training thread for one process)."""
        now = _clock.wall()
        first_seen = dict(self._signals.first_seen)
        reasons = {_reason_for(sig) for sig in first_seen}
        if self._watcher.kill_seen is not None:
            reasons.add(Reason.KILL_SWITCH)
        own_end = self._env_end_time or self._watcher.end_time
        end = own_end or agreed_end
        step_s = self._steps.estimate()
        save_s = self._saves.estimate() or 0.0
        margin = self.options.deadline_margin_s
        saves = budget_saves(self._periodic, now=now, step_s=step_s, steps_ahead=steps_ahead, save_s=save_s,
                             margin_s=margin, worst_step_s=self._steps.peak)
        if self.options.deadline and time_is_short(now=now, end=end, step_s=step_s, steps_ahead=steps_ahead,
                                                   save_s=save_s, margin_s=margin, worst_step_s=self._steps.peak,
                                                   saves=saves):
            reasons.add(Reason.DEADLINE)
        term = first_seen.get(signal.SIGTERM)
        unfit = False
        if term is not None:
            left = term + self.options.kill_wait_s - now - steps_ahead * (step_s or 0.0)
            unfit = left - 1.0 < save_s
        return Contribution(frozenset(reasons), step, 2, own_end, term, unfit)

    def _log_signals(self) -> None:
        seen = dict(self._signals.first_seen)
        self._signals_logged = len(seen)
        for sig, when in seen.items():
            logger.warning("rank %d received %s", self.rank, sig.name)
            self.events.emit("signal", signal=sig.name, received=when, count=self._signals.count.get(sig, 1))

    def _on_decision(self, decision: StopDecision) -> None:
        self._decision = decision
        names = sorted(r.value for r in decision.reasons)
        if self.rank == 0 and decision.reasons == {Reason.DEADLINE} and len(self._steps) == 0:
            # A requeue loop that never gets anywhere: each run stops before it could measure a single step.
            logger.warning(
                "the deadline stopped this run before its first measured step: the time left (%s) does not hold "
                "the margin (%.0f s) plus a save (%.0f s). Raise --time, or lower SLURMRT_DEADLINE_MARGIN_S / "
                "SLURMRT_SAVE_TIME_S", _left(decision.end_time), self.options.deadline_margin_s,
                self._saves.estimate() or 0.0)
        if self.rank == 0:
            logger.warning("all ranks stop at step %d: %s%s", decision.step, ", ".join(names),
                           "" if decision.save else " (no time to save before SIGKILL)")
            self.events.emit("decision", step=decision.step, reasons=names, save=decision.save,
                             end_time=decision.end_time, step_s=self._steps.estimate(), save_s=self._saves.estimate())

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def _get_store(self) -> CheckpointStore:
        if self._store is None:
            if self.options.checkpoint_dir is None:
                raise ConfigError(
                    "save() and load_latest() need a checkpoint directory: pass slurmrt.init(checkpoint_dir=...) or "
                    "set SLURMRT_CHECKPOINT_DIR (a path every node sees)",
                )
            token = f"{self.topology.requeue_id or 'local'}-r{self.restart_count}".replace("/", "_")
            self._store = CheckpointStore(self.options.checkpoint_dir, self._get_comm(),
                                          keep_last=self.options.keep_last, token=token)
            self._store.on_saved = self._on_saved
        return self._store

    def save(self, state: dict[str, Any] | SaveFn, *, step: int, blocking: bool = True) -> bool:
        """Checkpoint ``state`` (this rank's dict, or a callable writing into a directory) as ``step``.

        Collective: every rank calls it with the same step. After a stop, saves are blocking, and are skipped (False)
        when SIGTERM left less time than the measured save takes -- better a clean exit than a SIGKILL mid-write.
        """
        decision = self._decision
        if decision is not None and not decision.save:
            if self.rank == 0:
                logger.warning("not saving step %d: SIGTERM leaves too little time before SIGKILL (a save takes "
                               "about %.1f s); the previous checkpoint stays the latest", step, self._saves.estimate())
                self.events.emit("save_skipped", step=step, save_s=self._saves.estimate())
            return False
        store = self._get_store()
        store.save(state, step, blocking=blocking or decision is not None)
        self._last_tick = None  # a save between two steps is not step time
        self._heartbeat = _clock.mono()
        return True

    def _on_saved(self, result: SaveResult, blocking: bool) -> None:
        self._saves.add(result.seconds)
        if self._decision is None:  # a save the loop makes on its own schedule
            self._periodic.saved(_clock.wall() - result.seconds)
        if self.rank == 0:
            logger.info("checkpoint step %d committed: %.2f s, %d bytes", result.step, result.seconds, result.bytes)
            self.events.emit("save", step=result.step, seconds=round(result.seconds, 4), bytes=result.bytes,
                             blocking=blocking, path=str(result.path))

    def load_latest(self) -> tuple[int, Any] | None:
        """(step, state) of the newest complete checkpoint, the same one on every rank; None on a fresh start."""
        got = self._get_store().load_latest()
        if self.rank == 0:
            self.events.emit("resume" if got else "fresh_start", step=got[0] if got else None)
        return got

    # -- the end ---------------------------------------------------------------------------------------------------
    def finish(self) -> ExitCode:
        """Wait for saves, decide (once, on rank 0, for all) how the run ends, requeue if so, release handlers."""
        if self._closed:
            raise RuntimeError("finish() or exit() was already called")
        failed_save: CheckpointError | None = None
        if self._store is not None:
            try:
                self._store.wait()
            except CheckpointError as err:
                failed_save = err
                logger.error("the last background checkpoint failed: %s", err)
        if self._agreement is not None:
            self._agreement.finish()
        comm = self._get_comm()
        code, why = self._exit_code() if comm.rank == 0 else (ExitCode.FINISHED, "")
        if comm.rank == 0:
            self.events.emit("exit", code=int(code), outcome=code.name, why=why,
                             reasons=sorted(r.value for r in self._decision.reasons) if self._decision else [])
            logger.warning("exit %d (%s): %s", int(code), code.name, why) if code else logger.info("finished")
        # Every rank is past its saves; the others now wait in the broadcast below while rank 0 requeues. Slurm
        # ends every task of the job when it requeues it, and a rank that exited first with a non-zero code would
        # make `srun --kill-on-bad-exit` kill rank 0 before its requeue: so nobody leaves before the requeue.
        comm.all_ok(True)
        if comm.rank == 0 and code is ExitCode.REQUEUED and self.topology.requeue_id and _requeue_by_us(self._decision):
            done, message = requeue(self.topology.requeue_id)
            self.events.emit("requeue", done=done, message=message, restart_count=self.restart_count)
            (logger.warning if done else logger.error)("%s", message)
            if not done:
                code = ExitCode.REQUEUE_NEEDED
        code = ExitCode(comm.broadcast(int(code)))
        self.close()
        if failed_save is not None and code is ExitCode.FINISHED:
            return ExitCode.FAILED
        return code

    def exit(self) -> NoReturn:
        """:meth:`finish`, destroy the default process group if any, then ``sys.exit`` with the code.

        See :class:`slurmrt.ExitCode` for the codes. Destroying the group here spares the "process group was not
        destroyed" warning and NCCL's teardown hangs at interpreter exit; exit() ends the program anyway.
        """
        code = self.finish()
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(int(code))

    def close(self) -> None:
        """Restore signal handlers and stop background threads (finish() calls it).

        Collective when torch.distributed is in use: it ends the agreement rounds, which every rank takes part in.
        """
        if self._closed:
            return
        self._closed = True
        if self._agreement is not None:
            self._agreement.finish()
        self._signals.close()
        self._watcher.stop()
        unregister_process(self._registration)

    def _exit_code(self) -> tuple[ExitCode, str]:
        d = self._decision
        if d is None:
            return ExitCode.FINISHED, "all steps done"
        if Reason.KILL_SWITCH in d.reasons:
            return ExitCode.KILL_SWITCH, f"kill switch {self.options.kill_switch}: stopped, not requeued"
        if Reason.INTERRUPT in d.reasons:
            return ExitCode.STOPPED, "SIGINT: stopped, not requeued"
        if d.reasons == {Reason.TERM} and not _at_time_limit(d):
            return ExitCode.STOPPED, ("SIGTERM before the time limit (scancel, or preemption, which Slurm requeues "
                                      "itself): not requeued by slurmrt")
        if not self.options.requeue:
            return ExitCode.STOPPED, "stopped; requeue is off (requeue=False)"
        if not self.topology.is_slurm:
            return ExitCode.STOPPED, "stopped; not a SLURM job, nothing to requeue"
        limit = self.options.max_restarts
        if limit is not None and self.restart_count >= limit:
            return ExitCode.STOPPED, f"stopped; restart {self.restart_count} reached max_restarts={limit}"
        return ExitCode.REQUEUED, f"stopped at step {d.step} ({', '.join(sorted(r.value for r in d.reasons))}): requeue"


def _left(end_time: float | None) -> str:
    return "unknown" if end_time is None else f"{end_time - _clock.wall():.0f} s"


def _requeue_by_us(decision: StopDecision | None) -> bool:
    return decision is not None and bool(decision.reasons & {Reason.SIGNAL, Reason.DEADLINE, Reason.TERM})


def _at_time_limit(d: StopDecision) -> bool:
    return d.term_time is not None and d.end_time is not None and d.term_time >= d.end_time - TIME_LIMIT_TOLERANCE_S


def _reason_for(sig: signal.Signals) -> Reason:
    if sig is signal.SIGTERM:
        return Reason.TERM
    if sig is signal.SIGINT:
        return Reason.INTERRUPT
    return Reason.SIGNAL
