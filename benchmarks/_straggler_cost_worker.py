"""One rank of bench_straggler (a): the per-call cost of ``with rt.time_compute():`` and of ``rt.should_stop(step)``.

2 gloo ranks: ``should_stop`` takes its per-step path (the clearance the agreement's rounds grant); after a warm-up
of N calls, the window covers the rounds' period and no call waits for a round.
"""

from __future__ import annotations

import json
import statistics
import time

import torch.distributed as dist

import slurmrt

N = 200_000


def _empty() -> float:
    start = time.perf_counter_ns()
    for _ in range(N):
        pass
    return (time.perf_counter_ns() - start) / N


def _timer(rt: slurmrt.Runtime) -> float:
    timer = rt.time_compute()
    start = time.perf_counter_ns()
    for _ in range(N):
        with timer:
            pass
    return (time.perf_counter_ns() - start) / N


_next = 0


def _stop(rt: slurmrt.Runtime) -> float:
    global _next
    first, _next = _next, _next + N
    start = time.perf_counter_ns()
    for step in range(first, first + N):
        rt.should_stop(step)
    return (time.perf_counter_ns() - start) / N


def main() -> None:
    rt = slurmrt.init(watchdog=False, progress_s=None, deadline=False)
    dist.init_process_group("gloo")
    _stop(rt)  # the warm-up: the rounds learn the step time, the clearance grows past a round period
    rounds = [(_empty(), _timer(rt), _stop(rt)) for _ in range(5)]
    rt.close()
    dist.destroy_process_group()
    empty = statistics.median(r[0] for r in rounds)
    print(json.dumps({"empty_ns": empty, "timer_ns": statistics.median(r[1] for r in rounds) - empty,
                      "stop_ns": statistics.median(r[2] for r in rounds) - empty}))


if __name__ == "__main__":
    main()
