"""The GPUs of the health check, asked through NVML: the driver answers, Slurm's GPUs are there, and each has its
memory free.

NVML creates no CUDA context, so the check is safe on GPUs a live training holds (``slurmrt doctor --health`` beside
a job) and costs the training nothing; and it sees what an allocation of 64 MiB did not: a GPU whose memory a
leftover process or another job holds (the next training would run out of memory, or hang in its first collective,
on that GPU only). A GPU passes when at least :data:`FREE_FLOOR` of its memory is free; one that does not is named
with the processes NVML says hold it. After a step has ended (``slurmrt run``'s probe) the driver may take a moment
to give a dead process's memory back: the check looks again for ``settle_s`` before it says so.

Without the NVML bindings (``pip install slurmrt[gpu]``) the check falls back to a CUDA allocation of 64 MiB
(:func:`cuda_allocates`), which creates a context.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

__all__ = ["FREE_FLOOR", "check_gpus", "cuda_allocates", "nvml_findings"]

#: A GPU with less than this share of its memory free fails the check: the CUDA contexts of a starting job's own
#: ranks take about 0.5 GiB each, a leftover training process most of the memory.
FREE_FLOOR = 0.9
_MiB = 1 << 20


def check_gpus(env: Mapping[str, str], gpus: int, local_rank: int, *, settle_s: float = 0.0,
               nvml: Any = None) -> list[str]:
    """What is wrong with this node's ``gpus`` GPUs (as Slurm gave them), in words. ``nvml``: the bindings (None:
    import ``pynvml``; without it, the CUDA fallback)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found,import-untyped,no-redef]
        except ImportError:
            fallback = cuda_allocates(local_rank)
            return [fallback] if fallback else []
    try:
        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError_DriverNotLoaded and its kin: the finding
        return [f"the node has {gpus} GPU(s) but NVML does not answer ({type(err).__name__}: {err}): driver or "
                "device error"]
    try:
        deadline = time.monotonic() + settle_s
        while True:
            found = nvml_findings(nvml, env, gpus)
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)  # a dead process's memory, given back by the driver a moment after it ended
    finally:
        nvml.nvmlShutdown()


def nvml_findings(nvml: Any, env: Mapping[str, str], gpus: int) -> list[str]:
    """One NVML reading: Slurm's GPUs present, and each visible one with :data:`FREE_FLOOR` of its memory free."""
    count = int(nvml.nvmlDeviceGetCount())
    if count < gpus:
        return [f"Slurm gives the job {gpus} GPU(s) on this node but NVML sees {count}"]
    found = []
    for index in _visible(env, count, nvml):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        if memory.free >= FREE_FLOOR * memory.total:
            continue
        holders = _holders(nvml, handle)
        found.append(f"GPU {index}: {memory.free // _MiB} MiB free of {memory.total // _MiB} MiB, less than "
                     f"{FREE_FLOOR:.0%}" + (f": held by {holders}" if holders else "") +
                     " (a leftover process, or another job's)")
    return found


def _visible(env: Mapping[str, str], count: int, nvml: Any) -> list[int]:
    """NVML's indices of the GPUs this job sees: CUDA_VISIBLE_DEVICES by index or UUID, else all of them."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or not raw.strip():
        return list(range(count))
    words = {w.strip() for w in raw.split(",")}
    by_uuid = any(w.startswith(("GPU-", "MIG-")) for w in words)
    return [i for i in range(count) if str(i) in words or (by_uuid and _uuid(nvml, i) in words)]


def _uuid(nvml: Any, index: int) -> str:
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def _holders(nvml: Any, handle: Any) -> str:
    """The processes NVML says hold the GPU's memory: "pid 4242 (30720 MiB), ..."; "" when it does not say."""
    try:
        processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:  # noqa: BLE001 - not every driver lists them
        return ""
    said = [f"pid {p.pid}" + (f" ({int(p.usedGpuMemory) // _MiB} MiB)" if p.usedGpuMemory else "")
            for p in processes[:8]]
    return ", ".join(said) + (f" and {len(processes) - 8} more" if len(processes) > 8 else "")


def cuda_allocates(local_rank: int) -> str | None:
    """The fallback without NVML's bindings: CUDA answers and allocates 64 MiB on this rank's GPU."""
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
