"""The agreement's all-reduce in O(log N) hops over O(log N) connections per process.

A gloo group of all ranks (``new_group``) connects every process to every other one when it is made (N - 1
sockets each, about N² store reads in all) and reduces along a ring, in 2(N - 1) latency-bound hops: at large N
beyond the usual open-file limit, and slow (``benchmarks/RESULTS.md``, "The control plane at scale").

Here the ranks reduce by *recursive doubling*: at hop ``k`` each rank exchanges its running MAX with the rank whose
number differs in bit ``k``, so after ``log2(P)`` hops every one of the ``P`` ranks (the largest power of two up to
N) holds the MAX of all. The other ``N - P`` ranks first fold their value into rank ``r - P`` and get the result
back from it at the end: two hops more. Each hop runs on a gloo group of just those two ranks, made here from the
default group's store under a prefix of its own (not registered with ``torch.distributed``: no name to collide with
a user's group, nothing to destroy in its registry). All of a process's pairs share one gloo device: one listening
socket and one event loop, whatever the number of pairs (an event loop wakes even when idle, so slurmrt's two trees
share one).

MAX is idempotent, which is what makes the folded ranks' second hop correct and lets the same pair group serve both.

The trees made together share a :class:`PeerLoss`: the first hop that fails on a lost peer ends every other hop
still waiting in any of them. gloo alone does not always end them: a send that meets the closed connection before
gloo's event loop has read its end (``writev`` fails with EPIPE or ECONNRESET) is queued to be written later, and
the error the loop then raises reaches the pair's pending receives but not that queued send, whose wait lasts the
whole gloo timeout (30 minutes here). Seen on a rank woken from SIGSTOP after its peer had exited: its check's
broadcast waited in ``UnboundBuffer::waitSend`` while the agreement's round on the other tree had failed at once.

The same pairs gather every rank's bytes to rank 0 (:meth:`Tree.gather`, a save's file lists for its manifest) along
a binomial tree: the folded ranks first hand theirs to rank ``r - P``, then at hop ``k`` each rank still holding
bytes whose bit ``k`` is set hands all it holds to the rank without that bit, and is done. Rank 0 has everything
after ``log2(P) + 1`` hops at most; each rank's bytes cross at most that many links, where a ring's all-gather
passes every rank's bytes through every rank in ``N - 1`` steps.
"""

from __future__ import annotations

import datetime
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

from ._errors import AgreementError

__all__ = ["PeerLoss", "PeerLostError", "Tree", "gather_schedule", "partners", "wait_released"]

#: gloo's own default timeout: a peer that is alive but silent (a hang) is the hang monitor's business.
TIMEOUT = datetime.timedelta(minutes=30)

#: Tensors of hops abandoned at exit while gloo may still hold them: never let gloo's worker own the last reference.
_abandoned: list[Any] = []
#: Trees left open because a peer may be gone (their teardown could wait for it); kept until the process exits.
_kept: list[Tree] = []

_generation = 0
_generation_lock = threading.Lock()


class PeerLostError(AgreementError):
    """A hop given up because another hop of the trees made with it failed on a lost peer; says that peer's error.
    An :class:`~slurmrt.AgreementError`: the ranks can no longer agree, as when the agreement's own round fails."""


class PeerLoss:
    """The first error of a lost peer among the trees made together (see the module): set once, never cleared."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()  # the training thread and the agreement's may fail at once
        self.error: BaseException | None = None

    def record(self, err: BaseException) -> None:
        with self._lock:
            if not self._event.is_set():
                self.error = err
                self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def raise_it(self) -> None:
        """Raise :class:`PeerLostError` with the error first seen (its text names the connection that closed)."""
        err = self.error
        raise PeerLostError(f"a peer was lost, seen by another of slurmrt's groups: {type(err).__name__}: {err}"
                            ) from err


def partners(rank: int, size: int) -> list[int]:
    """The rank this rank exchanges with at each hop, in order (the same pair may come twice)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a group of {size}")
    p = 1 << (size.bit_length() - 1)  # the largest power of two up to size
    if rank >= p:
        return [rank - p, rank - p]
    levels = [rank ^ (1 << k) for k in range(p.bit_length() - 1)]
    return [rank + p, *levels, rank + p] if rank + p < size else levels


def gather_schedule(rank: int, size: int) -> list[tuple[int, bool]]:
    """The gather's hops for this rank, in order: (peer, True to hand it all this rank holds and stop / False to
    receive what the peer holds). Every peer is one of :func:`partners`'s: the same pairs serve both."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a group of {size}")
    p = 1 << (size.bit_length() - 1)
    if rank >= p:
        return [(rank - p, True)]
    hops = [(rank + p, False)] if rank + p < size else []
    for k in range(p.bit_length() - 1):
        bit = 1 << k
        if rank & bit:
            return [*hops, (rank ^ bit, True)]
        hops.append((rank | bit, False))
    return hops


class Tree:
    """This rank's pairs. Made collectively: every rank of the default group, at the same point of its program."""

    def __init__(self, rank: int, size: int, store: Any = None, *, timeout: datetime.timedelta = TIMEOUT,
                 device: Any = None, loss: PeerLoss | None = None) -> None:
        import torch.distributed as dist
        from torch.distributed import PrefixStore, ProcessGroupGloo

        global _generation
        with _generation_lock:  # every rank makes its trees in the same order, so the same number names the same
            _generation += 1
            generation = _generation
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        self.rank, self.size = rank, size
        self.loss = loss if loss is not None else PeerLoss()
        self._schedule = partners(rank, size)
        if device is None:
            device = ProcessGroupGloo.create_default_device()
        self._pairs: dict[int, Any] = {}
        # In the order of the hops: a rank and its partner at hop k have both made the pairs of their hops before k.
        for peer in self._schedule:
            if peer in self._pairs:
                continue
            lo, hi = min(rank, peer), max(rank, peer)
            options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._devices = [device]
            options._threads = 1
            options._timeout = timeout
            prefix = f"slurmrt/tree/{generation}/{lo}-{hi}"
            self._pairs[peer] = ProcessGroupGloo(PrefixStore(prefix, store), 0 if rank == lo else 1, 2, options)
        self._options = dist.AllreduceOptions()
        self._options.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]

    @property
    def hops(self) -> int:
        return len(self._schedule)

    @property
    def peers(self) -> list[int]:
        """The ranks this rank holds a connection to."""
        return list(self._pairs)

    def all_reduce_max(self, tensor: Any, abandon: threading.Event | None = None) -> bool:
        """``tensor`` (on the CPU) becomes the element-wise MAX over every rank; False if ``abandon`` was set
        first (the tensor is then kept alive here, as gloo may still hold it). Raises what gloo raises when a
        peer is gone."""
        for peer in self._schedule:
            pair = self._pairs[peer]
            if not _run(lambda: pair.allreduce([tensor], self._options), tensor, abandon,  # noqa: B023 - at once
                        self.loss):
                return False
        return True

    def gather(self, data: bytes) -> list[bytes] | None:
        """Every rank's ``data``, by rank, on rank 0; None on the others. Collective: every rank calls it."""
        held = {self.rank: data}
        for peer, hand_over in gather_schedule(self.rank, self.size):
            if hand_over:
                self._send(peer, pickle.dumps(held, protocol=pickle.HIGHEST_PROTOCOL))
                return None
            held.update(pickle.loads(self._receive(peer)))
        return [held[r] for r in range(self.size)]

    def _send(self, peer: int, data: bytes) -> None:
        import torch

        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        self._broadcast(peer, size, root=self.rank)
        self._broadcast(peer, payload, root=self.rank)

    def _receive(self, peer: int) -> bytes:
        import torch

        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(peer, size, root=peer)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(peer, payload, root=peer)
        return payload.numpy().tobytes()

    def _broadcast(self, peer: int, tensor: Any, *, root: int) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0 if root == min(self.rank, peer) else 1  # a pair's ranks: the lower rank is its 0
        pair = self._pairs[peer]
        _run(lambda: pair.broadcast([tensor], options), tensor, loss=self.loss)

    def close(self, *, destroy: bool = True) -> None:
        """Shut the pairs down; with ``destroy`` False (a peer may be gone), keep them as they are until exit."""
        if not destroy:
            _kept.append(self)
            return
        for pair in self._pairs.values():
            pair.shutdown()
        self._pairs.clear()

    def abort(self) -> None:
        """Close the pairs at once, without waiting for a peer (an in-process restart): a peer in a round with this
        rank gets gloo's "connection closed" and its round fails."""
        for pair in self._pairs.values():
            pair.abort()
        self._pairs.clear()


def _run(issue: Callable[[], Any], tensor: Any, abandon: threading.Event | None = None,
         loss: PeerLoss | None = None) -> bool:
    """Issue one operation of a pair on ``tensor`` and wait for it by polling; False (the tensor kept alive) if
    ``abandon`` is set first. Raises what gloo raises when a peer is gone, recorded in ``loss``; and
    :class:`PeerLostError` (the tensor kept alive) once ``loss`` holds another hop's."""
    # Shape: one wait polled for its three ends (done, abandoned, a peer lost elsewhere), then gloo's own error
    if loss is not None and loss.is_set():
        loss.raise_it()
    work = issue()  # the only reference: once dropped below, gloo's worker no longer holds the tensor
    pause = 0.00005
    while not work.is_completed():
        if abandon is not None and abandon.is_set():
            _abandoned.append(tensor)
            return False
        if loss is not None and loss.is_set():
            _abandoned.append(tensor)
            loss.raise_it()
        time.sleep(pause)
        pause = min(pause * 2, 0.002)
    try:
        work.wait()  # completed: returns at once, or raises the hop's error
    except Exception as err:
        if loss is not None:
            loss.record(err)
        raise
    del work
    wait_released(tensor)
    return True


def wait_released(*tensors: Any, timeout_s: float = 5.0) -> None:
    """Wait until nothing but Python references ``tensors`` (no finished work object holds them any more)."""
    deadline = time.monotonic() + timeout_s
    pause = 0.00005
    # Python's references to a tensor count once in its use count, however many there are; the rest are C++'s.
    while any(t._use_count() > 1 for t in tensors) and time.monotonic() < deadline:
        time.sleep(pause)  # releases the GIL, which the worker may need for its own bookkeeping
        pause = min(pause * 2, 0.002)
