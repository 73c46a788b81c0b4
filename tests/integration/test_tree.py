"""The agreement's all-reduce and the gathers over real gloo pairs, in processes of their own (the schedule alone is
checked in tests/unit/test_tree.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
from typing import Any

import pytest

from slurmrt._tree import partners


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def _worker(rank: int, size: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from slurmrt._comm import GlooComm
    from slurmrt._tree import Tree

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    before = _sockets()
    tree = Tree(rank, size)
    made = _sockets() - before
    t = torch.tensor([rank, -rank, 10 * rank], dtype=torch.int64)
    assert tree.all_reduce_max(t)
    again = torch.tensor([0, 0, 0], dtype=torch.int64)
    if rank == size - 1:
        again[0] = 99
    assert tree.all_reduce_max(again)
    # The work group's collectives over a tree of their own (no process group behind them here).
    comm = GlooComm(None, rank, size, Tree(rank, size))
    sent = comm.broadcast({"step": 7, "ranks": list(range(size))} if rank == 0 else None)
    agreed, refused = comm.all_ok(True), comm.all_ok(rank != size // 2)
    gathered = comm.gather({"rank": rank, "files": {f"rank_{rank}.pt": rank * 1000}} if rank != 2 else {})
    empty = tree.gather(b"" if rank % 2 else bytes([rank]) * (rank + 1))
    dist.barrier()
    # A round that one rank never joins: the others' waits end when told to abandon, not in gloo.
    abandon = threading.Event()
    abandon.set()
    abandoned = True if rank == 0 else tree.all_reduce_max(torch.zeros(1, dtype=torch.int64), abandon)
    out.put((rank, t.tolist(), int(again[0]), made, tree.peers, abandoned, sent, agreed, refused, gathered, empty))
    out.close()
    out.join_thread()  # the queue's feeder thread has sent the result
    os._exit(0)  # the abandoned round is still pending in gloo: leave without its teardown


@pytest.mark.parametrize("size", [5])
def test_real_gloo_pairs_reduce_broadcast_and_gather_over_few_sockets(size: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, size, port, out)) for r in range(size)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=300) for _ in range(size))
    for p in procs:
        p.join(60)
    for rank, reduced, again, made, peers, abandoned, sent, agreed, refused, gathered, empty in results:
        assert sent == {"step": 7, "ranks": list(range(size))}
        if rank == 0:
            assert gathered == [{"rank": r, "files": {f"rank_{r}.pt": r * 1000}} if r != 2 else {}
                                for r in range(size)]
            assert empty == [b"" if r % 2 else bytes([r]) * (r + 1) for r in range(size)]
        else:
            assert gathered is None and empty is None
        assert agreed is True and refused is False  # one rank's "no" is every rank's
        assert reduced == [size - 1, 0, 10 * (size - 1)]
        assert again == 99
        assert sorted(peers) == sorted(set(partners(rank, size)))
        # One listening socket for all the pairs, and one connection per peer: not one per rank of the job.
        assert made <= len(peers) + 1, (rank, made, peers)
        assert abandoned is False or rank == 0
