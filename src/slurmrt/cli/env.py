"""``slurmrt env``: export lines for an sbatch script, derived from the allocation.

Prints shell `export` lines derived from the allocation: MASTER_ADDR, MASTER_PORT, NNODES, GPUS_PER_NODE,
WORLD_SIZE and CUDA_DEVICE_MAX_CONNECTIONS by the rules. Exit 2 outside an allocation.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError
from ..launch import cuda
from ..launch.parallel import ParallelConfig
from ..launch.ports import master_port_for
from ..launch.slurmvars import job_of, ntasks
from ..launch.topology import from_environ
from ._common import add_command, add_parallel, parallel
from ._json import add_flag, emit


def run(args: argparse.Namespace) -> int:
    config = parallel(args, os.environ)
    arch = cuda.gpu_arch_major() if cuda.node_gpu_count(os.environ) else None
    lines = env_exports(os.environ, config, args.gpus_per_node, arch)
    if args.json:
        emit("env", _as_json(lines))
        return 0
    for line in lines:
        print(line)
    return 0


def _as_json(lines: list[str]) -> dict[str, Any]:
    """The lines as data: ``exports`` (name: value), ``unset`` (names to unset), ``notes`` (the comments)."""
    out: dict[str, Any] = {"exports": {}, "unset": [], "notes": []}
    for line in lines:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out["exports"][name] = value
        elif line.startswith("unset "):
            name, _, note = line.removeprefix("unset ").partition("#")
            out["unset"].append(name.strip())
            out["notes"].append(f"{name.strip()}: {note.strip()}")
        else:
            out["notes"].append(line.lstrip("# "))
    return out


def env_exports(env: Mapping[str, str], config: ParallelConfig, gpus_per_node: int | None,
                arch_major: int | None) -> list[str]:
    """Shell lines for an sbatch script: what torchrun/accelerate and the training script need."""
    # Shape: checks first, each naming its value, then the lines; one reading of the job feeds both
    slurm_job = job_of(env)
    if slurm_job is None or not slurm_job.nodes:
        raise ConfigError("slurmrt env runs inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset): "
                          "call it from the sbatch script or inside salloc")
    # The checks init() runs on the same variables: a malformed or inconsistent SLURM_*, MASTER_* or WORLD_SIZE is
    # refused here too, rather than exported for every task to trip over.
    topo = from_environ(env)
    job, hosts = slurm_job.id, list(slurm_job.nodes)
    nnodes = len(hosts)
    if gpus_per_node is not None and gpus_per_node < 0:
        raise ConfigError(f"--gpus-per-node={gpus_per_node}: a number of GPUs, 0 or more")
    gpus = gpus_per_node if gpus_per_node is not None else cuda.node_gpu_count(env)
    world = nnodes * gpus if gpus else (ntasks(env) or nnodes)
    port = str(topo.master_port) if env.get("MASTER_PORT") else str(master_port_for(job, "0"))
    lines = [
        f"export MASTER_ADDR={env.get('MASTER_ADDR') or hosts[0]}",
        f"export MASTER_PORT={port}",
        f"export NNODES={nnodes}",
        f"export GPUS_PER_NODE={gpus or 0}",
        f"export WORLD_SIZE={world}",
    ]
    return [*lines, _cuda_line(env, config, arch_major)]


def _cuda_line(env: Mapping[str, str], config: ParallelConfig, arch_major: int | None) -> str:
    if arch_major is None:
        return "# CUDA_DEVICE_MAX_CONNECTIONS: no GPU visible here, left unset"
    value = cuda.decide(env, arch_major, config)
    current = env.get(cuda.VARIABLE)
    if value is not None:
        return f"export {cuda.VARIABLE}={value}"
    if current is not None:
        return f"# {cuda.VARIABLE}={current} already exported and agrees with the rules"
    return f"unset {cuda.VARIABLE}  # the rules say: leave it to the driver"


def add_parser(sub: Any) -> None:
    p = add_command(sub, "env", run, doc=__doc__,
                    help="print export lines for an sbatch script (MASTER_ADDR, NNODES, ...)",
                    epilog="example (in an sbatch script): eval \"$(slurmrt env --tp 4)\"")
    add_parallel(p)
    p.add_argument("--gpus-per-node", type=int, help="default: what the node shows (SLURM_GPUS_ON_NODE, NVML)")
    add_flag(p)
