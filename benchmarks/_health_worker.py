"""One rank of bench_health: time STEPS steps of a loop that (a) asks nothing, (b) all-reduces its loss, as a loop
that logs a mean loss does every step, and (c) calls ``rt.check(step, loss=...)`` instead, which returns that mean
from its own all-reduce; and fewer steps of one that (d)
all-reduces a gradient the size of PARAMS float32 parameters, as data-parallel training does every step, and (e)
calls ``rt.check(step, loss=..., replicas=...)`` on those parameters, their hashes compared at every step (the
worst case: ``health_hash_every=1``); prints one JSON line."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

import slurmrt


def main() -> None:
    steps, work_s, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    params = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 20
    os.environ["SLURMRT_HEALTH_HASH_EVERY"] = "1"
    rt = slurmrt.init(deadline=False, watchdog=False)
    dist.init_process_group("gloo")
    rng = random.Random(seed * 1000 + rt.rank)
    losses = [2.0 * (1 + 0.05 * rng.gauss(0, 1)) for _ in range(steps)]
    buffer = torch.zeros(1)

    def work() -> None:
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass

    def empty(step: int) -> None:
        pass

    def all_reduce(step: int) -> None:
        buffer.fill_(losses[step])
        dist.all_reduce(buffer)

    def check(step: int) -> None:
        mean = rt.check(step, loss=losses[step])  # the mean loss a logging loop all-reduces, from the check's round
        assert mean is not None

    def measure(variant, count: int) -> float:  # type: ignore[no-untyped-def]
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(count):
            work()
            variant(step)
        return (time.perf_counter() - t0) / count

    variants = (("empty", empty, 1), ("all_reduce", all_reduce, 1), ("check", check, 1),
                *_replicated(rt, losses, params))
    for _, variant, fewer in variants:
        measure(variant, max(5, steps // 10 // fewer))  # warm-up
    # Interleaved blocks, the median of each variant's: a neighbour's burst on a shared machine lands in one block
    # of one variant, not in a variant's whole figure.
    blocks: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(5):
        for name, variant, fewer in variants:
            blocks[name].append(measure(variant, max(1, steps // 5 // fewer)))
    print(json.dumps({name: sorted(times)[len(times) // 2] for name, times in blocks.items()}))
    rt.close()
    dist.destroy_process_group()


def _replicated(rt, losses: list[float], params: int):  # type: ignore[no-untyped-def]
    """(d) and (e), timed on one step in 20 of the others' (each step moves 4 bytes per parameter)."""
    weights = [torch.randn(params // 4, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    gradient = torch.zeros(params)

    def grad_all_reduce(step: int) -> None:
        dist.all_reduce(gradient)

    def replicas(step: int) -> None:
        rt.check(step, loss=losses[step], replicas=weights)

    return (("grad_all_reduce", grad_all_reduce, 20), ("replicas", replicas, 20))


if __name__ == "__main__":
    main()
