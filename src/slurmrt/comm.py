"""The few collectives checkpoints and exit need, on a gloo group of their own, or trivially for one process.

They run on the training thread only (the agreement thread has its own group), after any background save has been
joined: two threads issuing collectives on one group could pair them up differently on different ranks.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Comm", "GlooComm", "SoloComm"]


class Comm(Protocol):
    rank: int
    world_size: int

    def all_ok(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` on every rank."""

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, by rank."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""


class SoloComm:
    rank = 0
    world_size = 1

    def all_ok(self, ok: bool) -> bool:
        return ok

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj


class GlooComm:
    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size

    def all_ok(self, ok: bool) -> bool:
        import torch
        import torch.distributed as dist

        t = torch.tensor([0 if ok else 1], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item()) == 0

    def all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
