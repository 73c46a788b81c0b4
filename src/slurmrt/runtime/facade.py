"""The :class:`Runtime` that ``init()`` returns: a thin facade over parts that each stand alone (the stop controller,
the checkpoint session, the hang monitor, the process hooks), which it builds and forwards the training loop's calls
to. How a run ends is the recovery executor's (:mod:`slurmrt.recovery`).
"""

from __future__ import annotations

import contextlib
from typing import Any, NoReturn

from .. import _clock
from .._comm import destroy_default_group
from .._errors import ConfigError
from ..checkpoint import lease as leases
from ..checkpoint.background import Staged
from ..checkpoint.store import SaveFn
from ..launch.topology import Topology
from ..options import Options
from ..record import experiment
from ..record.goodput import write_metrics
from ..recovery.conclude import conclude
from ..recovery.executor import Executor
from ..recovery.policy import ExitCode, Outcome
from ..stop.decision import Reason, StopDecision
from . import logs
from .parts import build_run
from .view import TopologyView

__all__ = ["Runtime"]


class Runtime(TopologyView):
    """Returned by :func:`slurmrt.init`: the topology, then the training-loop calls (docs/reference/api.md)."""

    def __init__(self, topology: Topology, options: Options, executor: Executor, *,
                 connections: str | None = None, lease: leases.Lease | None = None,
                 experiment_id: str | None = None) -> None:
        self.topology, self.options = topology, options
        self.events = executor.events
        self.cuda_device_max_connections = connections
        self._lease, self._experiment_id = lease, experiment_id
        #: The run's parts (runtime/parts.py): the facade forwards to them; ``run_restartable`` restarts them.
        self.parts = parts = build_run(topology, options, executor, lease=lease)
        self.stop, self.checkpoints, self.hangs = parts.stop, parts.checkpoints, parts.hangs
        self.outcome: Outcome | None = None  #: how the run ended, once finish() decided
        self._closed = False

    def _start(self) -> None:
        """Install the process-global hooks and start the watcher thread (init() calls it)."""
        self.parts.hooks.install()
        self.parts.watcher.start()
        switch = self.options.kill_switch
        self.parts.report.started(kill_switch=str(switch.resolve()) if switch else None,
                             connections=self.cuda_device_max_connections, experiment=self._experiment_id)

    event_log = property(lambda self: self.parts.executor.events.path, doc="the job's event log (None without one)")

    @property
    def experiment_id(self) -> str:
        """The same for every run of the job, across requeues: stored in ``experiment.json`` next to the checkpoints
        (new for a fresh checkpoint directory; ``experiment_id=`` overrides it). Without a checkpoint directory it
        cannot outlive the process, and ranks other than 0 each get their own."""
        if self._experiment_id is None:
            self._experiment_id = experiment.establish(self.options.checkpoint_dir, job=self.topology.requeue_id,
                                                       override=self.options.experiment_id)
        return self._experiment_id

    # -- the training loop -----------------------------------------------------------------------------------------
    def should_stop(self, step: int, *, before: str | None = None) -> bool:
        """True when the job must stop after ``step``: the same answer on every rank, at the same step. Cheap: a
        clock read and a comparison on most steps. The first call after ``init_process_group`` opens slurmrt's gloo
        groups (so do ``save`` and ``load_latest``, whichever comes first). ``before="eval"``: the ranks also agree
        (a collective) whether phase "eval", a save and the margin still fit before the end, and stop if not."""
        return self.stop.should_stop(step, before=before)

    def check(self, step: int, *, loss: Any = None, grad_norm: Any = None, replicas: Any = None) -> float | None:
        """The health of ``step`` (collective, one small all-reduce on the training's process group): a loss or a
        gradient norm that is not finite on any rank, or a loss far above its recent values, raises
        :class:`slurmrt.TrainingHealthError` on every rank at this step; call it before the optimizer step. Returns
        the mean of the ranks' losses, from the same all-reduce (log it instead of all-reducing the loss again). Under
        ``run_restartable`` the step is re-run from the newest checkpoint; a fault that comes back rewinds to the
        newest certified checkpoint and skips the batches since (:meth:`skip`; docs/guides/training-health.md).
        ``replicas``: a model (or tensors) every data-parallel rank holds the same copy of: their hashes are compared
        every ``health_hash_every`` steps, which finds a flipped bit that never makes a NaN."""
        return self.parts.health.check(step, loss=loss, grad_norm=grad_norm, replicas=replicas)

    def time_compute(self) -> contextlib.AbstractContextManager[None]:
        """``with rt.time_compute(): loss = model(batch)``: time this rank's own work, a section without collectives,
        once per step, so that a rank consistently slower than the others is named a straggler, with its node
        (``straggler`` options; docs/guides/in-job.md). Two clock reads per use; nothing is sent per
        step."""
        return self.stop.timer

    @property
    def straggler(self) -> tuple[int, str | None] | None:
        """(rank, node) of the straggler named last in this run, or None."""
        s = self.stop.straggler
        return (s.rank, self.stop.straggler_node) if s is not None else None

    def phase(self, name: str, *, timeout_s: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Mark a phase that is slow on every rank (an evaluation, the first compile, a data reshuffle): the
        watchdog gives it ``timeout_s``, or 3x its longest measured duration (``startup_timeout_s`` until
        measured), and its time is not step time. A stop that comes during it is acted on at the next
        ``should_stop``."""
        return self.stop.phase(name, timeout_s=timeout_s)

    def should_save(self, step: int) -> str | None:
        """The tier to save ``step`` to now ("shared", or "local" with a local tier), or None: the interval that
        balances the measured save stall against the job's failure rate (slurmrt.checkpoint.cadence). Call it on
        every rank at every step; at its check steps, about one per save, it is a collective. A step that starts
        again at 0 each epoch is counted on from the last one."""
        return self.parts.cadence.due(step)

    def save(self, state: dict[str, Any] | SaveFn | Staged, *, step: int, blocking: bool = True,
             local: Any = None, tier: str = "shared") -> bool:
        """Checkpoint ``state`` as ``step`` (collective): a dict of sharded state (DTensor, through DCP), this rank's
        dict, or a function writing into a directory; ``local`` is this rank's own state (:attr:`local_state`).
        After a stop, saves are blocking, and skipped (False) when SIGTERM left less time than a save takes.
        ``tier="local"``: this rank's dict into the node-local tier (``local_checkpoint_dir``), kept on this node
        and a partner node, always blocking; the shared tier (the default) is the durable one."""
        if tier not in ("shared", "local"):
            raise ConfigError(f"save(tier={tier!r}): 'shared' (the checkpoint directory) or 'local' "
                              "(local_checkpoint_dir, replicated to a partner node)")
        started = _clock.mono()
        with self.stop.doing("save"):
            saved = self.checkpoints.save(state, step=step, blocking=blocking, local=local,
                                          decision=self.stop.decision, tier=tier)
        self.parts.cadence.saved(tier, _clock.mono() - started, ok=saved)
        if saved and tier == "shared":
            self.parts.health.saved(step)  # certified once the training stays healthy after it
        self.stop.restart_step_clock()  # a save between two steps is not step time
        return saved

    def load_latest(self, *, into: dict[str, Any] | None = None, verify: bool = True) -> tuple[int, Any] | None:
        """(step, state) of the newest sound checkpoint, the same one on every rank; None on a fresh start. Sharded
        state is loaded in place into ``into`` (this run's state dict, resharded). ``verify`` checks every file's
        checksum (the ranks share the reading); a checkpoint that fails is skipped with a warning naming the file."""
        health = self.parts.health
        with self.stop.doing("load"):  # after a reproducible fault, none after the certified step it rewinds to
            got = self.checkpoints.load_latest(into=into, verify=verify, rank=self.rank, below=health.rewind_to())
            health.loaded(got.step if got is not None else None, self.checkpoints.from_lead)
        return (got.step, got.state) if got is not None else None

    def skip(self, step: int) -> bool:
        """True when the loop must not train on ``step``'s batch (take it from the data, then go to the next step):
        the run was rewound before it, past a fault that came back (docs/guides/training-health.md). The same on
        every rank; a lookup, nothing sent."""
        return self.parts.health.skip(step)

    resumed_step = property(lambda self: self.checkpoints.resumed_step, doc="the step load_latest() resumed from")
    local_state = property(lambda self: self.checkpoints.local_state, doc="this rank's `local` state, once loaded")
    loaded = property(lambda self: self.checkpoints.loaded, doc="True once load_latest() was called")
    stop_decision = property(lambda self: self.stop.decision, doc="the agreed stop (step, reasons), or None")
    end_time = property(lambda self: self.stop.end_time, doc="the job's end time (epoch s) as this rank knows it")

    @property
    def stop_reason(self) -> Reason | None:
        """The most final reason of the agreed stop, or None while running."""
        return self.stop.decision.reason if self.stop.decision is not None else None

    # -- the framework layer (integrations: the HF Trainer, Lightning, Megatron-LM) ---------------------------------
    def restart_step_clock(self) -> None:
        """The time since the last step boundary was not a training step (an evaluation, a framework's own save)."""
        self.stop.restart_step_clock()

    def reclaim_signals(self) -> None:
        """Put slurmrt's signal recorders back where a framework replaced them (Lightning, at the start of fit)."""
        self.parts.hooks.reclaim_signals()

    def local_reasons(self) -> frozenset[Reason]:
        """This rank's own reasons to stop (signals, the kill switch), not agreed with the others."""
        return self.stop.local_reasons()

    def stopped(self, reasons: frozenset[Reason], *, step: int, term_time: float | None = None) -> StopDecision:
        """A framework stopped every rank at ``step`` by itself; collective: the ranks exchange their reasons, and
        :meth:`finish` decides the exit from their union, as for a stop slurmrt agreed."""
        return self.stop.stopped(reasons, step=step, term_time=term_time)

    # -- the end ---------------------------------------------------------------------------------------------------
    def finish(self) -> ExitCode:
        """Wait for saves, decide how the run ends, requeue if so, then close(). Every rank returns rank 0's outcome:
        the others wait for it while rank 0 requeues."""
        if self._closed:
            raise RuntimeError("finish() or exit() was already called")
        with self.stop.doing("save"):  # waits for saves, and for the other ranks
            failed_save = not self.checkpoints.wait()
            self.stop.end_rounds()
            self.outcome, action = conclude(self.stop.decision, executor=self.parts.executor,
                                            comm=self.parts.hooks.groups().work, failed_save=failed_save,
                                            step=self.stop.last_step, exclude=self.stop.exclude_nodes,
                                            progressed=self.stop.steps_done > 0)
        if self.options.metrics_file is not None and self.rank == 0:
            write_metrics(self.options.metrics_file, self.parts.executor.events.path, job=self.job_id or "local",
                          experiment=self.experiment_id)
        if self.outcome is Outcome.FINISHED:  # nothing will resume from this node's local tier
            self.checkpoints.clear_local()
        if action.for_good and self.topology.rank == 0:  # no run of ours follows: its lock file goes
            logs.remove_job_lock()
        self.close()
        return self.outcome.code

    def exit(self) -> NoReturn:
        """:meth:`finish`, destroy the default process group if any, then ``sys.exit`` with the code: the one way
        a script ends (see :class:`slurmrt.ExitCode`). Destroying the group spares NCCL's teardown hangs."""
        code = self.finish()
        destroy_default_group()
        raise SystemExit(int(code))

    def close(self) -> None:
        """Stop the background threads (a background save is waited for) and undo the process-global hooks, without
        deciding anything (finish() calls it). Collective when torch.distributed is in use."""
        if self._closed:
            return
        self._closed = True
        self.parts.state.activity = None  # the watchdog stands down
        self.stop.end_rounds()
        self.parts.watcher.stop()
        # A background save still in flight is the user's checkpoint, and its thread is inside a collective: the
        # interpreter must not end under it (gloo aborts the process). Let it commit; and let the pruned checkpoints'
        # files go.
        self.checkpoints.close()
        agreement = self.stop.agreement
        # After a failed round a peer is probably gone: destroying the groups could wait for it.
        self.parts.hooks.undo(destroy_groups=agreement is None or not agreement.failed)
        if self._lease is not None:
            self._lease.release()  # the next task of an --array=...%1 chain may take the directory now

