"""Launch checks that run on every rank before any rendezvous, so a misconfigured job fails in seconds.

A wrong node count or duplicated node ranks do not fail in ``init_process_group``: the ranks that did start wait
for the ones that never will, until the NCCL or store timeout (30 minutes by default). Each check here turns one such
hang into a :class:`~slurmrt.ConfigError` naming the value, the rule and the fix.
"""

from __future__ import annotations

import errno
import socket

from .._errors import ConfigError, GpuCountError, NodeCountError, ParallelismError
from . import hostlist
from .parallel import ParallelConfig
from .topology import LaunchMode, Topology

__all__ = ["check", "check_master_port"]


def check(topo: Topology, declared: ParallelConfig, *, node_gpus: int | None) -> None:
    """Raise the first :class:`~slurmrt.ConfigError` this launch deserves; return quietly when it looks sound.

    ``node_gpus`` is the number of GPUs this node gives the job (``None`` when it cannot be known, e.g. no NVML).
    """
    _check_nnodes(topo, declared)
    _check_gpus(topo, declared, node_gpus)
    model = declared.model_parallel
    if topo.world_size % model:
        raise ParallelismError(
            f"world size {topo.world_size} is not divisible by TP x PP x CP = {declared.tp} x {declared.pp} x "
            f"{declared.cp} = {model}; the data-parallel size would not be a whole number. Change the node or task "
            "count, or the parallel sizes, so that the world size is a multiple of their product",
            world_size=topo.world_size,
            tp=declared.tp,
            pp=declared.pp,
            cp=declared.cp,
        )


def _check_nnodes(topo: Topology, declared: ParallelConfig) -> None:
    if declared.nnodes is None or not topo.is_slurm:
        return
    if topo.mode is LaunchMode.BATCH:
        actual, what = topo.job_nnodes, "the allocation has"
    else:
        actual, what = topo.nnodes, "this step runs on"
    if actual is None or actual == declared.nnodes:
        return
    where = f" ({hostlist.compress(topo.nodelist)})" if topo.nodelist else ""
    raise NodeCountError(
        f"NNODES={declared.nnodes} but {what} {actual} nodes{where}, SLURM_JOB_NUM_NODES={topo.job_nnodes}. "
        f"The rendezvous would wait for {declared.nnodes} nodes and hang until its timeout. "
        f"Fix: {_nnodes_fix(topo, declared.nnodes, actual)}",
        declared=declared.nnodes,
        actual=actual,
    )


def _nnodes_fix(topo: Topology, declared: int, actual: int) -> str:
    """How NNODES comes to agree: never the setting that made it wrong. NNODES equal to the allocation while the step
    runs on fewer nodes (``slurmrt run``'s spare nodes, ``srun --nodes``) came from ``$SLURM_NNODES`` in the batch
    script: the fix is the step's count, not that."""
    if topo.job_nnodes is not None and declared == topo.job_nnodes and actual < declared:
        spare = declared - actual
        return (f"NNODES is the node count of the step that trains, which leaves {spare} of the allocation's "
                f"{declared} out (slurmrt run --spare-nodes {spare}, or srun --nodes {actual}): "
                f"NNODES=$((SLURM_NNODES - {spare})) in the batch script, or NNODES={actual}")
    return "make `#SBATCH --nodes` and NNODES agree, e.g. NNODES=$SLURM_NNODES in the batch script"


def _check_gpus(topo: Topology, declared: ParallelConfig, node_gpus: int | None) -> None:
    if declared.gpus_per_node is not None and node_gpus is not None and declared.gpus_per_node != node_gpus:
        raise GpuCountError(
            f"GPUS_PER_NODE={declared.gpus_per_node} but {node_gpus} GPUs are visible on {topo.hostname}. Fix: "
            "request them with `#SBATCH --gpus-per-node=N` (or --gres=gpu:N) and set GPUS_PER_NODE to the same N",
            declared=declared.gpus_per_node,
            visible=node_gpus,
        )
    if node_gpus and topo.local_world_size > node_gpus:
        raise GpuCountError(
            f"{topo.local_world_size} processes on {topo.hostname} but only {node_gpus} GPUs: two processes would "
            "share a GPU (NCCL fails with 'Duplicate GPU detected'). Fix: one task per GPU, e.g. "
            "`--ntasks-per-node` equal to `--gpus-per-node`, or torchrun --nproc_per_node equal to the GPU count",
            local_world_size=topo.local_world_size,
            visible=node_gpus,
        )


def check_master_port(topo: Topology) -> None:
    """Rank 0 of an ``srun`` launch is about to serve the rendezvous on ``MASTER_PORT``: if another process already
    listens there (another job on the node, a run still exiting), ``init_process_group`` would fail with a bare
    EADDRINUSE, or the ranks would meet someone else's store. Say so now, with the port and the fix.

    Only for ``srun``: under a launcher (torchrun, accelerate) the launcher's own store holds the port by design."""
    if topo.rank != 0 or topo.world_size < 2 or topo.mode is not LaunchMode.SRUN:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store: a TIME_WAIT leftover is fine
        try:
            s.bind(("", topo.master_port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                return  # not ours to judge (no IPv4, say): the rendezvous will tell
            raise ConfigError(
                f"MASTER_PORT {topo.master_port} is already in use on {topo.master_addr} (rank 0 serves the "
                "rendezvous there): another job on this node, or a run still exiting, listens on it. Fix: export "
                "MASTER_PORT to a free port in the sbatch script (1024-65535; without it slurmrt derives one from "
                "the job and step ids)", port=topo.master_port, host=topo.master_addr) from None
