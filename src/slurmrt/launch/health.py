"""The node health check at start-up (``health_check=True``): cheap, and before any rendezvous can hang on it.

What the cluster guides tell people to run by hand on every node before they exclude one: the GPU answers and can
allocate memory, ``/dev/shm`` (where NCCL and the data loaders keep shared memory) and the checkpoint directory are
writable. :func:`check_node` runs them in one process per node (local rank 0) during ``init()``; the communication
check, a barrier with a timeout, runs at the first collective (:meth:`slurmrt.Runtime` opens its groups there).
``slurmrt doctor --health`` runs the same node checks by hand (``srun --ntasks-per-node=1 slurmrt doctor --health``
checks every node of an allocation).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

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


def _cuda(local_rank: int) -> str | None:
    try:
        import torch
    except ImportError:
        return "the node has GPUs but torch cannot be imported"
    if not torch.cuda.is_available():
        return "the node has GPUs but torch.cuda.is_available() is False (driver or device error)"
    try:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        block = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        block.fill_(1)
        torch.cuda.synchronize(device)
        del block
    except Exception as err:  # noqa: BLE001 - any CUDA error is the finding
        return f"cannot allocate 64 MiB on GPU {local_rank}: {type(err).__name__}: {err}"
    return None


def check_node(env: Mapping[str, str], *, checkpoint_dir: Path | None, gpus: int, local_rank: int) -> list[str]:
    """What is wrong with this node, in words; empty when it is healthy."""
    failures: list[str | None] = []
    if env.get(SIM_UNHEALTHY_ENV):
        failures.append(f"simulated failure ({SIM_UNHEALTHY_ENV}={env[SIM_UNHEALTHY_ENV]})")
    if Path("/dev/shm").is_dir():
        failures.append(_writable(Path("/dev/shm"), "/dev/shm"))
    if checkpoint_dir is not None:
        failures.append(_writable(checkpoint_dir, "the checkpoint directory"))
    if gpus:
        failures.append(_cuda(local_rank))
    return [f for f in failures if f]
