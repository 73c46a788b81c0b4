"""The replica hash: data-parallel replicas hold the same parameters, so a cheap hash of each rank's copy names the
rank whose copy differs. It finds silent data corruption that never makes a NaN (a bit flipped in a GPU's memory or
arithmetic), every ``health_hash_every`` steps of ``rt.check(..., replicas=model)``.

The hash is exact, not a float sum: each tensor's bytes are read as integers of its width and summed in int64
(wrapping), weighted by the tensor's place, so that one flipped bit anywhere changes it. One all-gather of one int64
per rank then compares the copies; the odd ones out are the ranks whose hash differs from the most common one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from .._errors import ConfigError

__all__ = ["digest", "flip_bit", "odd_ranks", "tensors_of"]

#: A flipped bit that leaves the value finite and close: a low mantissa bit, by element width.
_LOW_BIT = {2: 3, 4: 13, 8: 40}


def tensors_of(replicas: Any) -> list[Any]:
    """The tensors of ``replicas`` (a module's parameters and buffers, or tensors); sharded ones are refused: their
    shards differ by rank by design."""
    if hasattr(replicas, "state_dict") and callable(replicas.state_dict):
        tensors = list(replicas.state_dict().values())
    elif isinstance(replicas, Iterable):
        tensors = list(replicas)
    else:
        raise ConfigError(f"rt.check(replicas=...): a module or tensors every data-parallel rank holds the same copy "
                          f"of, not {type(replicas).__name__}")
    for t in tensors:
        if type(t).__name__ == "DTensor" or not hasattr(t, "element_size"):
            raise ConfigError("rt.check(replicas=...): the copies every data-parallel rank holds whole; "
                              f"{type(t).__name__} is sharded or not a tensor (pass the replicated part only)")
    return tensors


def digest(tensors: list[Any]) -> Any:
    """One int64 on the tensors' device: their bytes as integers, summed (wrapping) and weighted by place."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    total = None
    for place, t in enumerate(tensors, start=1):
        if t.numel() == 0:
            continue
        flat = t.detach().reshape(-1)
        part = flat.view(ints[flat.element_size()]).sum(dtype=torch.int64) * place
        total = part if total is None else total + part
    return total if total is not None else torch.zeros((), dtype=torch.int64)


def odd_ranks(hashes: list[int]) -> list[int]:
    """The ranks whose hash differs from the most common one (the first seen among equals); [] when all agree."""
    common, _ = Counter(hashes).most_common(1)[0]
    return [rank for rank, h in enumerate(hashes) if h != common]


def flip_bit(tensors: list[Any]) -> bool:
    """Flip a low mantissa bit of the first floating-point element (a rehearsal of silent corruption); False: none."""
    import torch

    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    for t in tensors:
        if t.is_floating_point() and t.numel() and t.element_size() in ints and t.is_contiguous():
            view = t.detach().view(-1).view(ints[t.element_size()])
            view[0] ^= 1 << _LOW_BIT[t.element_size()]
            return True
    return False
