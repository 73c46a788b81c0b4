"""A stand-in for NVML's Python bindings on the test cluster, whose GPUs are GRES without devices: two GPUs of 80 GiB
per node, all memory free, except on the node named in $FAKE_NVML_HELD, whose GPU 1 a leftover process holds. Only
the calls slurmrt makes."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

_GiB = 1 << 30


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def nvmlInit() -> None:  # noqa: N802 - NVML's names
    pass


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
    return index


def nvmlDeviceGetUUID(handle: int) -> str:  # noqa: N802
    return f"GPU-fake-{_node()}-{handle}"


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:  # noqa: N802
    return 9, 0


def _held(handle: int) -> bool:
    return handle == 1 and os.environ.get("FAKE_NVML_HELD") == _node()


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:  # noqa: N802
    free = 8 * _GiB if _held(handle) else 80 * _GiB
    return SimpleNamespace(total=80 * _GiB, free=free, used=80 * _GiB - free)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:  # noqa: N802
    return [SimpleNamespace(pid=4242, usedGpuMemory=72 * _GiB)] if _held(handle) else []
