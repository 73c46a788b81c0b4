"""One rank of bench_stop_check: time STEPS steps of each way of asking "should we stop?", and the CPU it costs.

The baseline ("empty", asking nothing) is measured first, before slurmrt's agreement thread exists, so that the
thread's own cost is never subtracted out of the figure for slurmrt. Each variant's CPU is the whole process's
(`time.process_time`: the training thread, the agreement thread, gloo's threads), per second of wall time.
"""

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
    busy = sys.argv[3] == "busy"  # busy: a step that keeps the CPU (a GPU launch loop); sleep: one that waits
    # The blocking collectives cost milliseconds with 8 processes on 2 cores: fewer steps measure them as well.
    collective_steps = max(200, steps // 20)
    rt = slurmrt.init(deadline=False)
    dist.init_process_group("gloo")
    flag = torch.zeros(1, dtype=torch.int32)
    gathered = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size())]

    def work() -> None:
        if not work_s:
            return
        if not busy:
            time.sleep(work_s)
            return
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass

    def megatron(step: int) -> bool:  # DistributedSignalHandler.signals_received(): all_gather a flag every step
        dist.all_gather(gathered, flag)
        return any(int(t.item()) for t in gathered)

    def lightning(step: int) -> bool:  # rank 0 decides, broadcast every step
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def empty(step: int) -> bool:
        return False

    step = 0

    def measure(check, count: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
        nonlocal step
        dist.barrier()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            work()
            if check(step):
                raise SystemExit("nobody asked to stop")
            step += 1  # slurmrt's steps keep counting up, as in training
        wall = time.perf_counter() - t0
        return {"step_s": wall / count, "cpu": (time.process_time() - cpu0) / wall}

    out: dict[str, dict[str, float]] = {}
    measure(empty, max(50, steps // 10))  # warm-up: caches, the first barrier
    out["empty"] = measure(empty, steps)  # clean: no agreement thread yet
    for name, check in (("megatron_all_gather", megatron), ("lightning_broadcast", lightning)):
        measure(check, max(20, collective_steps // 10))  # warm-up
        out[name] = measure(check, collective_steps)
    # slurmrt: the first steps start the agreement thread and learn the step time; then the measured steps.
    measure(rt.should_stop, max(50, steps // 10))
    out["slurmrt"] = measure(rt.should_stop, steps)
    out["slurmrt"]["window"] = float(rt.stop.agreement.window) if rt.stop.agreement is not None else 0.0
    print(json.dumps(out))
    rt.close()


if __name__ == "__main__":
    main()
