"""``CUDA_DEVICE_MAX_CONNECTIONS``: the rule, the GPU architecture read without a CUDA context, and applying it.

The variable sets how many hardware work queues the CUDA driver opens per device. It is read once, when the CUDA
context is created, so it must be set before anything touches CUDA; that is why the architecture comes from NVML
and why :func:`apply` refuses to run after CUDA was initialised.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import CudaConnectionsError, CudaInitializedError
from .parallel import ParallelConfig
from .slurmvars import gpus_on_node

__all__ = ["ParallelConfig", "apply", "gpu_arch_major", "max_connections", "node_gpu_count", "parse_megatron_args"]

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"


def max_connections(arch_major: int, *, tp: int = 1, cp: int = 1, fsdp: bool = False,
                    moe_overlap: bool = False) -> str | None:
    """The value ``CUDA_DEVICE_MAX_CONNECTIONS`` must have for this job, or ``None`` to leave it unset.

    Rules, strongest first, and why they are ordered so:

    1. ``overlap_moe_expert_parallel_comm`` -> ``"32"``. Overlapping expert-parallel all-to-all with compute needs
       many hardware queues; Megatron-LM refuses to start with 1, so this rule wins over every other.
    2. Torch-FSDP2 or Megatron-FSDP -> never ``"1"`` (``None``: the driver default, 8). FSDP overlaps its
       all-gathers and reduce-scatters with compute on separate streams; one queue would serialise them. So FSDP
       beats the TP/CP rule even on pre-Blackwell GPUs.
    3. Blackwell or newer (compute capability major >= 10) -> ``None``. The ordering the TP rule relies on is not
       needed there, and one connection would only cost overlap.
    4. Pre-Blackwell with TP > 1 or CP > 1 -> ``"1"``: one queue makes kernels start in launch order, so the
       TP/CP communication kernel is scheduled before the compute kernel it should overlap with.
    5. Otherwise ``None``.
    """
    if moe_overlap:
        return "32"
    if fsdp:
        return None
    if arch_major >= 10:
        return None
    if tp > 1 or cp > 1:
        return "1"
    return None


def parse_megatron_args(argv: Sequence[str]) -> ParallelConfig:
    """The facts the rule needs, from Megatron-LM's command line."""
    return ParallelConfig().with_megatron_args(argv)


def node_gpu_count(env: Mapping[str, str]) -> int | None:
    """GPUs this node gives the job: SLURM_GPUS_ON_NODE, else NVML's count, else CUDA_VISIBLE_DEVICES.

    None when it cannot be known.
    """
    given = gpus_on_node(env)
    if given is not None:
        return given
    count = _nvml_count()
    if count is not None:
        return count
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return None


def gpu_arch_major() -> int | None:
    """Compute-capability major of GPU 0 via NVML (no CUDA context); ``None`` without NVML or GPUs."""

    def major(nvml: Any) -> int | None:
        if nvml.nvmlDeviceGetCount() == 0:
            return None
        found, _minor = nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(0))
        return int(found)

    return _with_nvml(major)


def _nvml_count() -> int | None:
    return _with_nvml(lambda nvml: int(nvml.nvmlDeviceGetCount()))


def _with_nvml(query: Callable[[Any], int | None]) -> int | None:
    """``query(pynvml)`` between NVML's init and shutdown; None when NVML is missing or finds no driver."""
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded: a machine without NVIDIA GPUs
        return None
    try:
        return query(pynvml)
    finally:
        pynvml.nvmlShutdown()


def decide(env: Mapping[str, str], arch_major: int | None, config: ParallelConfig) -> str | None:
    """The value to export, ``None`` for nothing to do; raises when the user's own value breaks the rules."""
    if arch_major is None:
        return None  # no GPU: nothing to set
    wanted = max_connections(arch_major, tp=config.tp, cp=config.cp, fsdp=config.fsdp, moe_overlap=config.moe_overlap)
    current = env.get(VARIABLE)
    if current is not None:
        forbidden_one = current.strip() == "1" and (config.fsdp or config.moe_overlap)
        if forbidden_one or (wanted is not None and current.strip() != wanted):
            raise CudaConnectionsError(
                f"{VARIABLE}={current} is exported, but this job needs "
                f"{wanted if wanted is not None else 'it unset (or > 1)'}: "
                f"{_why(arch_major, config)}. Fix: remove the export from the batch script and let slurmrt set it",
                current=current,
                wanted=wanted,
            )
        return None  # the user's value agrees with the rules: keep it
    return wanted


def apply(env: Mapping[str, str], arch_major: int | None, config: ParallelConfig) -> str | None:
    """Decide and export into ``os.environ``; refuses when CUDA is already initialised and a change is needed."""
    value = decide(env, arch_major, config)
    if value is None or arch_major is None:
        return None
    torch = sys.modules.get("torch")  # never import torch just to ask: `import slurmrt` stays light
    if torch is not None and torch.cuda.is_initialized():
        raise CudaInitializedError(
            f"CUDA is already initialised, so setting {VARIABLE}={value} would have no effect "
            f"({_why(arch_major, config)}). Fix: call slurmrt.init() before anything that touches CUDA "
            "(torch.cuda.*, .cuda(), model.to('cuda'))",
            wanted=value,
        )
    os.environ[VARIABLE] = value
    return value


def _why(arch_major: int, config: ParallelConfig) -> str:
    return (
        f"compute capability {arch_major}.x, TP={config.tp}, CP={config.cp}, FSDP={config.fsdp}, "
        f"MoE overlap={config.moe_overlap}"
    )
