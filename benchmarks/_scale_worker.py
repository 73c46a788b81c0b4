"""One rank of bench_scale: what each design of the agreement's group costs this process, and its rounds' time.

"full": the design before issue 24, a gloo group of every rank made eagerly (what ``new_group`` makes), reducing
along gloo's ring. "tree": :class:`slurmrt._tree.Tree`, recursive doubling over 2-rank pairs. Both are made here
from the default group's store through a counting wrapper, so the store requests of their set-up are counted; both
reduce the agreement's 17 int64 with MAX, waited for the same way (polled, as the agreement thread does). Rounds
alternate between the two, so that the machine's noise falls on both alike. Then what slurmrt opens now
(``open_groups``): its sockets as made, and after the collectives of a save and a resume (all_ok, gather,
broadcast). Last, a sharded save and a resume through slurmrt's checkpoint store, then the same state through
``dcp.save`` on the work group's gloo group (how slurmrt saved sharded state before): the sockets each opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from statistics import median
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo

from slurmrt._comm import open_groups
from slurmrt._tree import Tree


class Counting(dist.Store):
    """Counts the requests that reach the real store."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.requests = 0

    def set(self, key: str, value: Any) -> None:
        self.requests += 1
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.requests += 1
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        self.requests += 1
        return self.inner.add(key, value)

    def check(self, keys: list[str]) -> bool:
        self.requests += 1
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.requests += 1
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        self.requests += 1
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        self.requests += 1
        return self.inner.num_keys()

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self.requests += 1
        return self.inner.compare_set(key, expected, desired)


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def polled(work: Any) -> None:
    pause = 0.00005
    while not work.is_completed():
        time.sleep(pause)
        pause = min(pause * 2, 0.002)
    work.wait()


def main() -> None:
    rounds = int(sys.argv[1])
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    out: dict[str, Any] = {"rank": rank}

    counting = Counting(store)
    before = sockets()
    full = ProcessGroupGloo(PrefixStore("bench/full", counting), rank, size, timedelta(minutes=5))
    out["full_sockets"], out["full_requests"] = sockets() - before, counting.requests

    counting = Counting(store)
    before = sockets()
    tree = Tree(rank, size, store=counting)
    out["tree_sockets"], out["tree_requests"], out["tree_hops"] = sockets() - before, counting.requests, tree.hops
    out["tree_peers"] = len(tree.peers)

    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    ring_s, tree_s = [], []
    for i in range(rounds + 3):
        t = torch.full((17,), rank + i, dtype=torch.int64)
        start = time.perf_counter()
        polled(full.allreduce([t], options))
        mid = time.perf_counter()
        assert int(t[0]) == size - 1 + i
        t = torch.full((17,), rank + i, dtype=torch.int64)
        tree.all_reduce_max(t)
        end = time.perf_counter()
        assert int(t[0]) == size - 1 + i
        if i >= 3:  # the first rounds connect lazily where a transport does, and warm up
            ring_s.append(mid - start)
            tree_s.append(end - mid)
    out["ring_round_s"], out["tree_round_s"] = median(ring_s), median(tree_s)
    out["tree_samples_s"], out["ring_samples_s"] = tree_s, ring_s

    full.shutdown()
    tree.close()
    # What slurmrt opens (open_groups: the agreement's tree, the work group's tree and its lazy gloo group), then
    # the work group's collectives of a save and a resume.
    dist.barrier()
    before = sockets()
    groups = open_groups(size)
    out["groups_sockets_made"] = sockets() - before
    groups.work.all_ok(True)
    groups.work.gather({"rank": rank, "files": {f"rank_{rank}.pt": {"size": 1}}})
    groups.work.broadcast([1, 2, 3] if rank == 0 else None)
    out["groups_sockets_used"] = sockets() - before
    sharded_sockets(groups, rank, size, out)
    dist.barrier()
    groups.destroy()
    print(json.dumps(out), flush=True)


def sharded_sockets(groups: Any, rank: int, size: int, out: dict[str, Any]) -> None:
    """The sockets a sharded save and a resume through slurmrt's store open, then those ``dcp.save`` of the same
    state on the work group's gloo group opens (its planning gathers every rank's plan to rank 0)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from slurmrt.checkpoint.store import CheckpointStore

    where = Path(os.environ["SLURMRT_BENCH_SCALE_DIR"])
    mesh = init_device_mesh("cpu", (size,))
    state = {"w": DTensor.from_local(torch.full((4, 64), float(rank)), mesh, [Shard(0)], run_check=False)}
    dist.barrier()
    before = sockets()
    store = CheckpointStore(where / "store", groups.work)
    store.save(state, 1)
    into = {"w": DTensor.from_local(torch.empty(4, 64), mesh, [Shard(0)], run_check=False)}
    got = store.load_latest(into=into)
    assert got is not None and torch.equal(into["w"].to_local(), state["w"].to_local())
    store.close()
    out["sharded_sockets"] = sockets() - before
    dist.barrier()
    before = sockets()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(where / "dcp"), process_group=groups.work.group)
    out["dcp_save_sockets"] = sockets() - before


if __name__ == "__main__":
    main()
