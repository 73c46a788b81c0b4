"""The snapshot a background save writes: a state copied into host buffers kept from one save to the next, while
training changes the originals (:class:`Stager`)."""

from __future__ import annotations

import copy
import sys
from typing import Any

from .sharded import _sharded_types

__all__ = ["Stager"]


class Stager:
    """Copies a state into host buffers kept from one save to the next (pinned when the tensor is on a GPU, so the
    copy runs at the link's speed and the next copy reuses them): the snapshot a background save writes while
    training changes the originals. Shardings survive: a DTensor's local shard is copied and wrapped again.

    With ``shared`` (:class:`~.helper.SharedBuffers`), the buffers are in shared memory, for the save helper
    process: all of them in one segment, allocated again only when the state's layout changes."""

    def __init__(self, shared: Any = None) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}
        self._devices: set[Any] = set()
        self.shared = shared
        self._layout: list[tuple[Any, ...]] | None = None

    def stage(self, obj: Any) -> Any:
        import torch

        self._devices = set()
        if self.shared is not None:
            self._allocate_shared(obj)
        out = self._stage(obj, (), _sharded_types())
        for device in self._devices:  # only where a tensor was: a synchronize elsewhere would create a CUDA context
            torch.cuda.synchronize(device)  # the non_blocking copies into pinned memory are done
        return out

    def _allocate_shared(self, obj: Any) -> None:
        """One shared segment for every tensor of ``obj``, unless the last one has the same layout."""
        leaves: list[tuple[tuple[Any, ...], Any]] = []
        _tensor_leaves(obj, (), leaves, _sharded_types())
        layout = [(key, tuple(t.shape), tuple(t.stride()), t.dtype) for key, t in leaves]
        if layout == self._layout:
            return
        pin = any(t.device.type == "cuda" for _, t in leaves)
        buffers = self.shared.allocate([(shape, stride, dtype) for _, shape, stride, dtype in layout], pin=pin)
        self._buffers = {key: buf for (key, _, _, _), buf in zip(layout, buffers, strict=True)}
        self._layout = layout

    def _buffer(self, key: tuple[Any, ...], t: Any) -> Any:
        import torch

        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.stride() != t.stride():
            pin = t.device.type == "cuda"
            buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        if t.device.type == "cuda":
            self._devices.add(t.device)
        buf.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        return buf

    def _stage(self, obj: Any, key: tuple[Any, ...], sharded: tuple[type, ...]) -> Any:
        import torch

        dtensor = sys.modules.get("torch.distributed.tensor")
        if dtensor is not None and isinstance(obj, dtensor.DTensor):
            local = self._buffer(key, obj.to_local())
            return dtensor.DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False, shape=obj.shape,
                                      stride=obj.stride())
        if sharded and isinstance(obj, sharded):  # a ShardedTensor: the DTensors were handled above
            raise TypeError("a ShardedTensor (FSDP1's sharded state dict) cannot be saved in the background: "
                            "save it with blocking=True, or use FSDP2 (DTensor)")
        if isinstance(obj, torch.Tensor):
            return self._buffer(key, obj)
        if isinstance(obj, dict):
            return {k: self._stage(v, (*key, k), sharded) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._stage(v, (*key, i), sharded) for i, v in enumerate(obj))
        return copy.deepcopy(obj)


def _tensor_leaves(obj: Any, key: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any]],
                   sharded: tuple[type, ...]) -> None:
    """The dense tensors :meth:`Stager._stage` copies, with their keys, in its order (a DTensor's local shard)."""
    # Shape: one case per kind of leaf or container, the same walk as the stager's, so both orders agree
    import torch

    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(obj, dtensor.DTensor):
        obj = obj.to_local()
    elif sharded and isinstance(obj, sharded):
        return
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided:
            out.append((key, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _tensor_leaves(v, (*key, k), out, sharded)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensor_leaves(v, (*key, i), out, sharded)
