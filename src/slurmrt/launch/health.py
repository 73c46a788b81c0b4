"""The node health check at start-up (``health_check=True``): cheap, and before any rendezvous can hang on it.

What the cluster guides tell people to run by hand on every node before they exclude one: the GPUs answer and have
their memory free (:mod:`.gpucheck`, through NVML: no CUDA context), ``/dev/shm`` (where NCCL and the data loaders
keep shared memory) and the checkpoint directory are writable. :func:`check_node` runs them in one process per node
(local rank 0) during ``init()``; the communication check, a barrier with a timeout, runs at the first collective
(:meth:`slurmrt.Runtime` opens its groups there).
``slurmrt doctor --health`` runs the same node checks by hand (``srun --ntasks-per-node=1 slurmrt doctor --health``
checks every node of an allocation).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .gpucheck import check_gpus

__all__ = ["SIM_UNHEALTHY_ENV", "check_node"]

#: Set by ``slurmrt sim --unhealthy-node N`` for the tasks of node N: the check fails there, as a real one would.
SIM_UNHEALTHY_ENV = "SLURMRT_SIM_UNHEALTHY"


def _writable(directory: Path, what: str) -> str | None:
    # A file of our own, made with O_EXCL (mkstemp): a fixed name in /dev/shm, which every user can write to, let a
    # planted symlink turn the probe into an overwrite of whatever the link pointed at.
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".slurmrt-health-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(probe)
    except OSError as err:
        return f"{what} {directory} is not writable: {err}"
    return None


def check_node(env: Mapping[str, str], *, checkpoint_dir: Path | None, gpus: int, local_rank: int,
               settle_s: float = 0.0) -> list[str]:
    """What is wrong with this node, in words; empty when it is healthy. ``settle_s``: how long a GPU's memory may
    take to be given back (after a step ended) before it counts as held (:mod:`.gpucheck`)."""
    failures: list[str | None] = []
    if env.get(SIM_UNHEALTHY_ENV):
        failures.append(f"simulated failure ({SIM_UNHEALTHY_ENV}={env[SIM_UNHEALTHY_ENV]})")
    if Path("/dev/shm").is_dir():
        failures.append(_writable(Path("/dev/shm"), "/dev/shm"))
    if checkpoint_dir is not None:
        failures.append(_writable(checkpoint_dir, "the checkpoint directory"))
    if gpus:
        failures += check_gpus(env, gpus, local_rank, settle_s=settle_s)
    return [f for f in failures if f]
