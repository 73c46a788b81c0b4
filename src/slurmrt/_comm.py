"""slurmrt's own gloo process groups, and the few collectives checkpoints and the exit need on them.

Two groups, created together by :func:`open_groups` (collectively: every rank reaches it at the same point of its
program): the *control* group (a :class:`~slurmrt._tree.Tree`: O(log N) hops and connections) belongs to the
agreement thread alone, the *work* group (a :class:`GlooComm`) to whichever thread saves, loads or exits -- one at
a time: a background save holds it until it is joined, and the training thread joins it before its next
collective. Two threads issuing collectives on one group could pair them up differently on different ranks; hence
two groups. The work group's agreements, broadcasts and gathers run over a tree of its own too (DCP runs no collective:
:mod:`slurmrt.checkpoint.sharded`); its gloo group, for the local tier's sends to a partner and the health
check's monitored barrier, connects lazily (``TORCH_GLOO_LAZY_INIT``): a process holds sockets only to the ranks it
has exchanged with, not to all N - 1 of them.

Every collective here runs on tensors slurmrt owns and returns only once gloo's worker thread has dropped its
reference to them (:func:`~slurmrt._tree.wait_released`). The reason is a crash at interpreter exit, seen as
``terminate called without an active exception`` and SIGABRT in about 1 of 50 finished torchrun runs: a gloo
worker thread (``ProcessGroupGloo::runLoop``) releases a finished work item a moment after ``wait()`` returned. If
that work held the last reference to a Python tensor -- the temporaries of ``broadcast_object_list`` do -- the
worker must take the GIL to free it. When the main thread has meanwhile begun to finalize the interpreter, CPython
ends the worker thread from inside ``take_gil`` (``pthread_exit``), which unwinds through a ``noexcept`` C++ frame:
``std::terminate``. The core dump showed exactly that stack (``~AsyncBroadcastWork`` -> ``decref_pyobject`` ->
``PyThread_exit_thread``). Waiting for the release while this thread still holds the tensor means the worker never
frees a Python object at all.
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from ._errors import ConfigError
from ._tree import PeerLoss, Tree, wait_released

__all__ = ["Comm", "GlooComm", "Groups", "SoloComm", "open_groups", "problems", "wait_released"]

LAZY_INIT = "TORCH_GLOO_LAZY_INIT"


class Comm(Protocol):
    rank: int
    world_size: int

    def all_ok(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` on every rank."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj``, by rank, on rank 0; None on the others."""


class SoloComm:
    rank = 0
    world_size = 1

    def all_ok(self, ok: bool) -> bool:
        return ok

    def broadcast(self, obj: Any) -> Any:
        return obj

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]


def problems(comm: Comm, problem: Any) -> list[Any]:
    """Every rank's ``problem`` that is not None, the same list on every rank. One agreement when there is none (a
    tree's O(log N) hops); every rank's value only when some rank has one, gathered to rank 0 and sent back."""
    if comm.all_ok(problem is None):
        return []
    got = comm.gather(problem)
    return list(comm.broadcast([p for p in got if p is not None] if got is not None else None))


class GlooComm:
    """The work group's collectives: ``all_ok``, ``broadcast`` and ``gather`` (a manifest's every rank's files, to
    rank 0, with each rank's DCP metadata) over ``tree`` (its own, never the agreement's) in O(log N) hops; on
    ``group``, a gloo group that connects on first use, the local tier's sends to a partner and the health check's
    monitored barrier. DCP runs no collective (:mod:`slurmrt.checkpoint.sharded`)."""

    def __init__(self, group: Any, rank: int, world_size: int, tree: Tree) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.tree = tree

    def all_ok(self, ok: bool) -> bool:
        import torch

        t = torch.tensor([0 if ok else 1], dtype=torch.int64)
        self.tree.all_reduce_max(t)
        return int(t.item()) == 0

    def gather(self, obj: Any) -> list[Any] | None:
        got = self.tree.gather(pickle.dumps(obj))
        return None if got is None else [pickle.loads(b) for b in got]

    def broadcast(self, obj: Any) -> Any:
        import torch

        # Rank 0's bytes, zeros elsewhere: their MAX is rank 0's bytes on every rank.
        payload = _encode(obj) if self.rank == 0 else None
        size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
        self.tree.all_reduce_max(size)
        buf = payload.clone() if payload is not None else torch.zeros(int(size.item()), dtype=torch.uint8)
        self.tree.all_reduce_max(buf)
        return _decode(buf)


def _encode(obj: Any) -> Any:
    import torch

    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _decode(t: Any) -> Any:
    return pickle.loads(t.numpy().tobytes())


@dataclass(frozen=True)
class Groups:
    """What :func:`open_groups` made: ``control`` is None for one process, where nothing needs agreeing."""

    control: Tree | None
    work: Comm

    def destroy(self, *, peers_alive: bool = True) -> None:
        """Destroy the two groups (a local call); the default group stays the user's. When a peer may be gone
        (``peers_alive`` False), leave them as they are: tearing them down could wait for it."""
        dist = torch_distributed()
        if self.control is None or dist is None or not dist.is_initialized():
            return
        self.control.close(destroy=peers_alive)
        if isinstance(self.work, GlooComm):
            self.work.tree.close(destroy=peers_alive)
        if peers_alive:
            dist.destroy_process_group(getattr(self.work, "group", None))

    def abort(self) -> None:
        """Close both trees at once (an in-process restart; the work group's gloo group goes with the default one):
        a peer still in a round with this rank fails it instead of waiting."""
        if self.control is not None:
            self.control.abort()
        if isinstance(self.work, GlooComm):
            self.work.tree.abort()


def open_groups(world_size: int = 1) -> Groups:
    """The control and work groups when ``torch.distributed`` runs more than one rank, else a one-process stand-in.

    Collective when there are several ranks: ``new_group`` must be called by every rank in the same order.
    ``world_size`` is the number of processes of the launch: with more than one, ``torch.distributed`` must be
    initialized, or each rank would stop, save and commit on its own (two ranks committing one checkpoint).
    """
    dist = torch_distributed()
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank, size = dist.get_rank(), dist.get_world_size()
        group = _lazy_gloo_group(dist)
        # One gloo device (a listening socket and an event loop thread) for both trees. Not the lazy group's:
        # pairs made on a lazily connecting group's device never connected (seen here).
        from torch.distributed import ProcessGroupGloo

        device = ProcessGroupGloo.create_default_device()
        loss = PeerLoss()  # a peer lost in one tree ends the other's waits too (see slurmrt._tree)
        control = Tree(rank, size, device=device, loss=loss)
        return Groups(control, GlooComm(group, rank, size, Tree(rank, size, device=device, loss=loss)))
    if world_size > 1:
        raise ConfigError(
            f"the launch has {world_size} processes but torch.distributed is not initialized: should_stop(), save() "
            "and load_latest() agree across ranks through it. Call torch.distributed.init_process_group() first "
            "(env:// works: slurmrt.init() exported RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a framework that "
            "initializes it inside its train() call (Lightning) needs slurmrt's integration for it",
            world_size=world_size)
    return Groups(None, SoloComm())


def _lazy_gloo_group(dist: Any) -> Any:
    """A gloo group of all ranks whose connections are made on first use (gloo reads the variable as the group is
    made; a value the user set is left as it is)."""
    before = os.environ.get(LAZY_INIT)
    os.environ.setdefault(LAZY_INIT, "1")
    try:
        return dist.new_group(backend="gloo")
    finally:
        if before is None:
            os.environ.pop(LAZY_INIT, None)


def torch_distributed() -> Any:
    """``torch.distributed`` if the program imported torch; never imports it (``import slurmrt`` stays light)."""
    torch = sys.modules.get("torch")
    return getattr(torch, "distributed", None) if torch is not None else None


def destroy_default_group() -> None:
    """Destroy torch.distributed's default group, if the program made one: spares the "process group was not
    destroyed" warning and NCCL's teardown hangs at interpreter exit."""
    dist = torch_distributed()
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
