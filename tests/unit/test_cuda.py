from __future__ import annotations

import sys
import types

import pytest

from slurmrt import CudaConnectionsError, CudaInitializedError, cuda
from slurmrt.launch.cuda import decide, max_connections, parse_megatron_args
from slurmrt.launch.parallel import ParallelConfig


@pytest.mark.parametrize(("arch", "kw", "expected"), [
    (9, {"tp": 2}, "1"),  # Hopper, TP: one queue keeps comm kernels ahead of compute
    (8, {"cp": 2}, "1"),
    (9, {}, None),
    (10, {"tp": 8}, None),  # Blackwell: leave it
    (12, {"cp": 2}, None),
    (9, {"tp": 2, "fsdp": True}, None),  # FSDP: never 1, even pre-Blackwell with TP
    (9, {"tp": 2, "moe_overlap": True}, "32"),
    (10, {"moe_overlap": True}, "32"),
    (9, {"fsdp": True, "moe_overlap": True}, "32"),
])
def test_max_connections_rules(arch: int, kw: dict[str, object], expected: str | None) -> None:
    assert max_connections(arch, **kw) == expected  # type: ignore[arg-type]


def test_megatron_flags_are_read_in_both_spellings() -> None:
    config = parse_megatron_args(["pretrain_gpt.py", "--tensor-model-parallel-size", "4",
                                  "--context-parallel-size=2", "--pipeline-model-parallel-size", "2",
                                  "--use-torch-fsdp2", "--overlap-moe-expert-parallel-comm"])
    assert config == ParallelConfig(tp=4, pp=2, cp=2, fsdp=True, moe_overlap=True)
    assert parse_megatron_args(["--use-megatron-fsdp"]).fsdp


def test_megatron_flag_without_an_integer_is_an_error() -> None:
    with pytest.raises(CudaConnectionsError, match="--tensor-model-parallel-size needs an integer"):
        parse_megatron_args(["--tensor-model-parallel-size", "--bf16"])


def test_without_a_gpu_nothing_is_set() -> None:
    assert decide({}, None, ParallelConfig(tp=8)) is None


def test_a_user_value_that_agrees_is_kept_and_one_that_breaks_the_rules_fails() -> None:
    assert decide({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, 9, ParallelConfig(tp=2)) is None
    with pytest.raises(CudaConnectionsError, match="CUDA_DEVICE_MAX_CONNECTIONS=1 is exported.*FSDP=True"):
        decide({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, 9, ParallelConfig(fsdp=True))
    with pytest.raises(CudaConnectionsError, match="needs 1"):
        decide({"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, 9, ParallelConfig(tp=2))
    assert decide({"CUDA_DEVICE_MAX_CONNECTIONS": "16"}, 9, ParallelConfig(fsdp=True)) is None


def test_apply_exports_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    import os

    assert cuda.apply(os.environ, 9, ParallelConfig(tp=2)) == "1"
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_apply_refuses_after_cuda_was_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    import os

    with pytest.raises(CudaInitializedError, match="call slurmrt.init\\(\\) before anything that touches CUDA"):
        cuda.apply(os.environ, 9, ParallelConfig(tp=2))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ


def test_node_gpu_count_prefers_slurm_then_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "_nvml_count", lambda: None)
    assert cuda.node_gpu_count({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}) == 4
    assert cuda.node_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert cuda.node_gpu_count({}) is None
