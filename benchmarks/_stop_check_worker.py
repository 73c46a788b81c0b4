"""One rank of bench_stop_check: time STEPS steps of each way of asking "should we stop?", and the CPU it costs.

The baseline ("empty", asking nothing) is measured first, before slurmrt's agreement thread exists, so that the
thread's own cost is never subtracted out of the figure for slurmrt. Each variant's CPU is the whole process's
(`time.process_time`: the training thread, the agreement thread, gloo's threads), per second of wall time. And,
read from each thread's own scheduler statistics (nanoseconds), what slurmrt's threads took in its measured steps:
the threads named ``slurmrt-*`` and every thread born after the baseline (slurmrt's gloo event loops and workers),
apart from the training thread's own.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import slurmrt


def thread_cpu() -> dict[int, float]:
    """Seconds of CPU each thread of this process ran, by thread id (Linux's schedstat; empty elsewhere)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


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

    main_tid = threading.get_native_id()
    baseline_threads: set[int] = set()

    def measure(check, count: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
        nonlocal step
        dist.barrier()
        threads0, cpu0, t0 = thread_cpu(), time.process_time(), time.perf_counter()
        for _ in range(count):
            work()
            if check(step):
                raise SystemExit("nobody asked to stop")
            step += 1  # slurmrt's steps keep counting up, as in training
        wall = time.perf_counter() - t0
        threads = thread_cpu()
        names = {t.native_id: t.name for t in threading.enumerate()}
        ran = {tid: cpu - threads0.get(tid, 0.0) for tid, cpu in threads.items()}
        own = sum(cpu for tid, cpu in ran.items()
                  if tid != main_tid and (names.get(tid, "").startswith("slurmrt") or tid not in baseline_threads))
        return {"step_s": wall / count, "cpu": (time.process_time() - cpu0) / wall,
                "main_cpu": ran.get(main_tid, 0.0) / wall, "slurmrt_threads_cpu": own / wall}

    out: dict[str, dict[str, float]] = {}
    measure(empty, max(50, steps // 10))  # warm-up: caches, the first barrier
    out["empty"] = measure(empty, steps)  # clean: no agreement thread yet
    baseline_threads.update(thread_cpu())  # the program's own threads (its gloo group's among them)
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
