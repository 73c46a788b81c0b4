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


def _loss_worker(rank: int, size: int, port: int, out: Any, done: Any) -> None:
    """Rank 1 waits in the work tree for rank 0, which is alive and never joins; rank 3 exits, so that rank 1's
    agreement round (its second hop is with rank 3) fails on the closed connection."""
    import torch
    import torch.distributed as dist

    from slurmrt._comm import open_groups

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    groups = open_groups(size)
    assert groups.control is not None
    dist.barrier()
    if rank == 3:
        os._exit(0)
    if rank != 1:  # rank 0's first hop with rank 1 lets rank 1 reach its hop with rank 3; rank 2 meets rank 3's end
        threading.Thread(target=_quietly, args=(groups.control.all_reduce_max, torch.zeros(1, dtype=torch.int64)),
                         daemon=True).start()
        done.wait(300)
        os._exit(0)
    work: dict[str, BaseException | None] = {}

    def wait_in_work_tree() -> None:
        try:
            groups.work.all_ok(True)  # type: ignore[union-attr]
            work["raised"] = None
        except BaseException as err:  # noqa: BLE001 - reported to the test
            work["raised"] = err

    waiting = threading.Thread(target=wait_in_work_tree, daemon=True)
    waiting.start()
    try:
        groups.control.all_reduce_max(torch.zeros(1, dtype=torch.int64))
        control = "completed"
    except Exception as err:  # noqa: BLE001 - rank 3 is gone
        control = f"{type(err).__name__}: {err}"
    waiting.join(120)  # without the shared loss: the work tree's wait for rank 0 lasts gloo's 30 minutes
    raised = work.get("raised")
    out.put((control, waiting.is_alive(), type(raised).__name__, str(raised), isinstance(raised, RuntimeError)))
    out.close()
    out.join_thread()
    os._exit(0)


def _quietly(fn: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):
        fn(*args)


def test_a_peer_lost_in_one_tree_ends_the_waits_of_the_other() -> None:
    """gloo does not end every wait on a lost peer (a send queued after its connection closed waits for gloo's
    timeout: slurmrt._tree). The two trees made together share what the first failure learned: rank 1's wait in the
    work tree, for a rank that is alive but never joins, ends as soon as its agreement round fails on rank 3's
    closed connection, and says so."""
    size = 4
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_loss_worker, args=(r, size, port, out, done)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        control, still_waiting, kind, message, runtime = out.get(timeout=300)
    finally:
        done.set()
        for p in procs:
            p.join(60)
    assert "Connection closed by peer" in control or "Connection reset by peer" in control, control
    assert not still_waiting
    assert kind == "PeerLostError" and runtime and "seen by another of slurmrt's groups" in message, message
    assert "Connection closed by peer" in message or "Connection reset by peer" in message, message
