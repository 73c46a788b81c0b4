"""What megatron-core needs to run on a CPU-only PyTorch (gloo), for the tests and for laptops. Used only when no
GPU is present: on GPUs the training script is plain Megatron.

Four things in megatron-core 0.16 assume CUDA:
- buffers allocated on ``torch.cuda.current_device()`` (the attention's global memory buffer);
- the model-parallel RNG tracker, which keeps CUDA generator states;
- ``torch.cuda.synchronize()`` in the checkpoint writer;
- the default causal mask, built on the GPU when no mask is passed (the script passes one: see ``causal_mask``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class CpuRngTracker:
    """megatron-core's model-parallel RNG tracker (named generator states, ``fork`` to draw from one) on the CPU
    generator."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_ = {}

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {name: state.clone() for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        if name in self.states_:
            raise ValueError(f"RNG state {name} already exists")
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


def install(seed: int) -> CpuRngTracker:
    """Patch megatron-core for the CPU and seed it as ``model_parallel_cuda_manual_seed(seed)`` would."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # buffers go to the CPU
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]  # nothing to wait for
    tracker = CpuRngTracker()
    random._CUDA_RNG_STATE_TRACKER = tracker
    random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(seed)  # the data-parallel (default) state, as Megatron seeds its CUDA generator
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tracker.add(random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + 100 * tp_rank)
    return tracker


def causal_mask(length: int, device: Any = "cpu") -> torch.Tensor:
    """The causal attention mask Megatron's attention takes: True where a position must not look (the future)."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]
