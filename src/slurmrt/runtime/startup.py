"""``init()``: read and check the launch, take the checkpoint directory's lease, resolve the recovery facts, and
build the :class:`~slurmrt.runtime.facade.Runtime`."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from .. import log
from ..checkpoint import lease as leases
from ..hang.response import unhealthy
from ..launch import cuda, health, preflight
from ..launch.launcher import launcher_argv
from ..launch.topology import Topology, from_environ
from ..options import Options, warn_unknown
from ..record import experiment
from ..record.events import EventLog
from ..record.ledger import Ledger
from ..recovery import facts as recovery_facts
from ..recovery import injob
from ..recovery.conclude import exit_at_init
from ..recovery.executor import Executor
from ..recovery.settings import RecoverySection
from ..stop import killswitch
from . import logs, misconfigured
from .facade import Runtime

__all__ = ["init"]

logger = logging.getLogger(__name__)


def init(options: Options | None = None, **overrides: Any) -> Runtime:
    """Read the launch, check it, export what ``torch.distributed`` needs, install the signal recorders.

    Call it first thing in the script, before anything touches CUDA. ``options`` (a :class:`slurmrt.Options`) and
    keyword ``overrides`` (its field names: ``checkpoint_dir=...``) win over the ``SLURMRT_*`` variables, which win
    over the defaults. Exits the process with code 0 when the kill switch already exists. A
:class:`~slurmrt.ConfigError` that the script does not catch, raised here or by a later call, ends it with one line
per node and exit code 78 (:mod:`.misconfigured`).
    """
    misconfigured.install(os.environ)
    rt = _init(options, overrides)
    misconfigured.passed(os.environ)
    return rt


def _init(options: Options | None, overrides: dict[str, Any]) -> Runtime:
    env = os.environ
    opts = Options.resolve(overrides, env, base=options)
    topo, node_gpus, connections = _launch(env, opts)
    lease = leases.take(opts.checkpoint_dir, topo, shared=opts.shared_checkpoint_dir) \
        if opts.checkpoint_dir is not None else None
    events = EventLog.for_job(opts.event_log, opts.checkpoint_dir, job=topo.requeue_id, restart=topo.restart_count,
                              rank=topo.rank, env=env, attempt=topo.attempt)
    facts = recovery_facts.resolve(RecoverySection.of(opts), topo, env, kill_switch=opts.kill_switch)
    executor = Executor(facts, events, node=topo.hostname,
                        ledger=Ledger.of(env, topo.cluster) if topo.is_slurm else None)
    _tell_supervisor(topo.rank, executor, opts)
    _may_train(env, opts, topo, executor, node_gpus)
    experiment_id = experiment.establish(opts.checkpoint_dir, job=topo.requeue_id, override=opts.experiment_id) \
        if topo.rank == 0 else None
    topo.apply(env)
    log.forget_prefix()  # log lines written before init() had no RANK yet
    rt = Runtime(topo, opts, executor, connections=connections, lease=lease, experiment_id=experiment_id)
    rt._start()
    return rt


def _launch(env: MutableMapping[str, str], opts: Options) -> tuple[Topology, int | None, str | None]:
    """The launch, read and checked before any rendezvous and before CUDA: (the topology, the node's GPUs, what
    ``CUDA_DEVICE_MAX_CONNECTIONS`` was set to). The log handler goes in first, so the warnings are lines of it."""
    topo = from_environ(env, launcher_argv=launcher_argv() if "RANK" in env else None)
    logs.install_default(topo.rank, wanted=opts.log_handler)
    warn_unknown(env, lead=topo.rank == 0)
    for warning in topo.warnings:
        logger.warning("%s", warning)
    node_gpus = cuda.node_gpu_count(env)
    preflight.check(topo, opts.parallel, node_gpus=node_gpus)
    preflight.check_master_port(topo)
    return topo, node_gpus, cuda.apply(env, cuda.gpu_arch_major() if node_gpus else None, opts.parallel)


def _may_train(env: Mapping[str, str], opts: Options, topo: Topology, executor: Executor,
               node_gpus: int | None) -> None:
    """The node passes its health check (else the unhealthy node's recovery, which exits) and no kill switch is
    there already (else a clean exit 0)."""
    if opts.health_check:
        failures = health.check_node(env, checkpoint_dir=opts.checkpoint_dir, gpus=node_gpus or 0,
                                     local_rank=topo.local_rank)
        if failures:
            unhealthy(executor, failures, nodes=[topo.hostname], node=topo.hostname)
    if opts.kill_switch is not None and killswitch.exists(opts.kill_switch):
        exit_at_init(opts.kill_switch, executor, lead=topo.rank == 0)


def _tell_supervisor(rank: int, executor: Executor, opts: Options) -> None:
    """Under ``slurmrt run``, rank 0 leaves the options this training resolved (``checkpoint_dir=`` in code, its
    event log) where the supervisor reads them: its decisions then use them and land in this event log."""
    if rank == 0 and executor.facts.in_job is not None:
        injob.share_facts(executor.facts.in_job, {**vars(opts), "event_log": executor.events.path})
