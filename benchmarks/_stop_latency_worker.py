"""One rank of bench_stop_latency: TRIALS episodes; in each, rank 0 signals a random rank at a random moment."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import slurmrt


def main() -> None:
    trials, step_s = int(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    current = {"step": -1}
    arrived: list[tuple[int, float]] = []  # (the step in progress, the time) when the signal landed
    # Our own handler, installed first: slurmrt chains it, so it sees the step in progress when the signal lands.
    signal.signal(signal.SIGUSR1, lambda *a: arrived.append((current["step"], time.time())))
    rng = random.Random(1234)
    out = []
    for _ in range(trials):
        victim, delay = rng.randrange(world), rng.uniform(0.05, 0.5)
        arrived.clear()
        rt = slurmrt.init(deadline=False, signals=["USR1"])
        dist.barrier()
        if rank == 0:
            threading.Timer(delay, os.kill, (pids[victim], signal.SIGUSR1)).start()
        step = 0
        while True:
            current["step"] = step
            time.sleep(step_s)
            if rt.should_stop(step):
                break
            step += 1
        stopped_at = time.time()
        landed = arrived[0] if arrived else (-1, -1.0)
        got = torch.tensor([step, landed[0], landed[1], stopped_at], dtype=torch.float64)
        every = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, got)
        stops = {int(t[0]) for t in every}
        signal_step = max(int(t[1]) for t in every)
        signal_time = max(float(t[2]) for t in every)
        out.append({"victim": victim, "stops": sorted(stops), "signal_step": signal_step,
                    "seconds": max(float(t[3]) for t in every) - signal_time})
        rt.finish()
        signal.signal(signal.SIGUSR1, lambda *a: arrived.append((current["step"], time.time())))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
