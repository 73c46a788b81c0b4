"""The GPUs of the health check through NVML (slurmrt.launch.gpucheck), with a stand-in at the NVML boundary: the
driver that does not answer, Slurm's GPUs missing, a GPU whose memory a leftover process holds (named with its
pid), the job's own GPUs only, and memory given back while the probe waits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from slurmrt.launch import gpucheck
from slurmrt.launch.gpucheck import check_gpus, nvml_findings

GiB = 1 << 30


class FakeNvml:
    def __init__(self, free: list[float], *, fails: Exception | None = None, readings: int = 0) -> None:
        self.free, self.fails, self.readings = free, fails, readings
        self.shut = False

    def nvmlInit(self) -> None:  # noqa: N802
        if self.fails is not None:
            raise self.fails

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.free)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetUUID(self, i: int) -> str:  # noqa: N802
        return f"GPU-{i}"

    def nvmlDeviceGetMemoryInfo(self, i: int) -> Any:  # noqa: N802
        if self.readings:  # the memory comes back after a few readings
            self.readings -= 1
            return SimpleNamespace(total=80 * GiB, free=1 * GiB)
        return SimpleNamespace(total=80 * GiB, free=int(self.free[i] * GiB))

    def nvmlDeviceGetComputeRunningProcesses(self, i: int) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(pid=4242, usedGpuMemory=70 * GiB)] if self.free[i] < 72 else []


def test_a_gpu_a_leftover_process_holds_is_named_with_its_pid() -> None:
    nvml = FakeNvml([80, 10])
    found = check_gpus({}, 2, 0, nvml=nvml)
    assert found == ["GPU 1: 10240 MiB free of 81920 MiB, less than 90%: held by pid 4242 (71680 MiB) (a leftover "
                     "process, or another job's)"]
    assert nvml.shut and check_gpus({}, 2, 0, nvml=FakeNvml([80, 79.5])) == []  # a context or two: healthy


def test_only_the_jobs_own_gpus_are_judged_by_index_or_uuid() -> None:
    nvml = FakeNvml([10, 80, 80, 10])
    assert nvml_findings(nvml, {"CUDA_VISIBLE_DEVICES": "1,2"}, 2) == []
    assert [f[:5] for f in nvml_findings(nvml, {"CUDA_VISIBLE_DEVICES": "GPU-3,1"}, 2)] == ["GPU 3"]
    assert [f[:5] for f in nvml_findings(nvml, {}, 2)] == ["GPU 0", "GPU 3"]


def test_a_driver_that_does_not_answer_or_gpus_missing_fail_the_node() -> None:
    said = check_gpus({}, 2, 0, nvml=FakeNvml([80, 80], fails=RuntimeError("Driver Not Loaded")))
    assert said == ["the node has 2 GPU(s) but NVML does not answer (RuntimeError: Driver Not Loaded): driver or "
                    "device error"]
    assert check_gpus({}, 4, 0, nvml=FakeNvml([80, 80])) == ["Slurm gives the job 4 GPU(s) on this node but NVML "
                                                             "sees 2"]


def test_the_probe_waits_for_a_dead_processs_memory_to_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000))
    monkeypatch.setattr(gpucheck.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(gpucheck.time, "sleep", lambda s: None)
    assert check_gpus({}, 1, 0, nvml=FakeNvml([80], readings=3), settle_s=10) == []
    assert check_gpus({}, 1, 0, nvml=FakeNvml([80], readings=30), settle_s=3) != []  # not back in time: said
