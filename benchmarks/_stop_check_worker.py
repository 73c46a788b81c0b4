"""One rank of bench_stop_check: time STEPS steps of each way of asking "should we stop?"."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

import slurmrt


def main() -> None:
    steps = int(sys.argv[1])
    work_s = float(sys.argv[2])
    # The blocking collectives cost milliseconds with 8 processes on 2 cores: fewer steps measure them as well.
    collective_steps = max(200, steps // 20)
    rt = slurmrt.init(deadline=False)
    dist.init_process_group("gloo")
    flag = torch.zeros(1, dtype=torch.int32)
    gathered = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size())]

    def work() -> None:
        if work_s:
            end = time.perf_counter() + work_s
            while time.perf_counter() < end:  # busy, like a step that keeps the CPU (a GPU launch loop)
                pass

    def megatron(step: int) -> bool:  # DistributedSignalHandler.signals_received(): all_gather a flag every step
        dist.all_gather(gathered, flag)
        return any(int(t.item()) for t in gathered)

    def lightning(step: int) -> bool:  # rank 0 decides, broadcast every step
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def empty(step: int) -> bool:
        return False

    variants = {"empty": empty, "megatron_all_gather": megatron, "lightning_broadcast": lightning,
                "slurmrt": rt.should_stop}
    out: dict[str, float] = {}
    step = 0
    for _ in range(2):  # the first pass warms up (thread start, group creation, caches); the second is measured
        for name, check in variants.items():
            count = collective_steps if name in ("megatron_all_gather", "lightning_broadcast") else steps
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(count):
                work()
                if check(step):
                    raise SystemExit("nobody asked to stop")
                step += 1  # slurmrt's steps keep counting up across passes, as in training
            out[name] = (time.perf_counter() - t0) / count
    print(json.dumps(out))
    rt.close()


if __name__ == "__main__":
    main()
