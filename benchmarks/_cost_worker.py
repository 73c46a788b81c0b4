"""A rank of bench_cluster_cost: init, load_latest, train, three saves, then the threads and sockets slurmrt added to
the process (those after the program's own process group connected), into <out>/rank<R>.json before it closes."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import slurmrt


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    rt = slurmrt.init()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()  # the program's own group connected: what slurmrt adds is counted from here
    base = {"threads": len(os.listdir("/proc/self/task")), "sockets": sockets()}
    rt.load_latest()
    w = torch.zeros(1024)
    for step in range(steps):
        time.sleep(0.05)
        w += 1
        if rt.should_stop(step):
            break
        if step % (steps // 3) == steps // 3 - 1:
            rt.save({"w": w}, step=step)
    held = {"threads": len(os.listdir("/proc/self/task")) - base["threads"], "sockets": sockets() - base["sockets"],
            "end_time": rt.end_time}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(json.dumps(held))
    rt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
