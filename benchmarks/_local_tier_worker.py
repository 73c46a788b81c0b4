"""One rank of the local-tier benchmark: the same state saved to the shared tier (blocking) and to the local tier
(its part, and the partner's replica received over gloo), alternated; prints the medians as one JSON line.

Each rank plays its own node (SLURMD_NODENAME), so that the local tier replicates across them as across nodes."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

rank = int(os.environ["RANK"])
os.environ.update({"SLURMD_NODENAME": f"bench{rank}", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "GROUP_RANK": str(rank)})

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import slurmrt  # noqa: E402

mb, rounds = float(sys.argv[1]), int(sys.argv[2])
rt = slurmrt.init(keep_last=1, local_keep=1, deadline=False, watchdog=False)
dist.init_process_group("gloo")
state = {"w": torch.randn(int(mb * 2**20 / 4))}
times: dict[str, list[float]] = {"shared": [], "local": []}
for i in range(rounds):
    for tier in ("shared", "local"):
        dist.barrier()  # start together
        t0 = time.perf_counter()
        assert rt.save(state, step=2 * i + (tier == "local"), tier=tier)
        times[tier].append(time.perf_counter() - t0)
rt.close()
dist.destroy_process_group()
print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
