"""The training-health check's cost per step (``rt.check(step, loss=...)``) on 2 and 4 gloo ranks.

Comparator in the same processes: the all-reduce of the loss that a loop which logs a mean loss already does every
step. ``rt.check`` judges this rank's value against its window (a median of up to 100 values) and all-reduces the sum of
the ranks' losses (NaN from a rank whose step is unhealthy): it returns the mean loss, so the loop drops its own
all-reduce, and the check's added time per step should be that all-reduce's, plus the judgement. Reported: the added
time per step against the same loop asking nothing, on the slowest rank, for each of 3 seeds (the losses' noise);
each figure the median of 5 blocks, the variants' blocks interleaved.

The replica hash (``rt.check(..., replicas=...)``) is measured per comparison, on 1 Mi float32 parameters (4 MiB),
against the all-reduce of a gradient of the same size that data-parallel training already does every step: its
added time over ``rt.check`` without replicas, and that over the gradient all-reduce's. At the default
``health_hash_every`` of 100 it is paid once per 100 steps.
"""

from __future__ import annotations

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_health_worker.py"


def run(quick: bool = False) -> Section:
    rows, figures = [], {}
    for work_ms in (0.0, 1.0):
        for world in (2, 4):
            for seed in range(3):
                steps = (300 if quick else 3000) if work_ms == 0 else (100 if quick else 1000)
                results = run_ranks(WORKER, world, [str(steps), str(work_ms / 1000), str(seed)])
                slowest = {k: max(r[k] for r in results) for k in results[0]}
                base = slowest["empty"]
                reduce_us, check_us, grad_us, hash_us = ((slowest[k] - base) * 1e6 for k in (
                    "all_reduce", "check", "grad_all_reduce", "replicas"))
                hash_us -= check_us  # the comparison alone: rt.check with replicas, less rt.check without
                ratio = check_us / reduce_us if reduce_us > 0 else float("nan")
                figures[f"{world}_ranks_{work_ms}ms_seed{seed}"] = {"all_reduce_us": reduce_us, "check_us": check_us,
                                                                    "grad_all_reduce_us": grad_us, "hash_us": hash_us}
                rows.append([world, f"{work_ms:g} ms", seed, f"{base * 1e6:.1f}", f"{reduce_us:.1f}",
                             f"{check_us:.1f}", f"{ratio:.2f}", f"{grad_us:.0f}", f"{hash_us:.0f}",
                             f"{hash_us / grad_us:.2f}" if grad_us > 0 else "-"])
    body = table(["ranks", "step work", "seed", "empty loop µs/step", "loss all-reduce +µs", "rt.check +µs",
                  "check / all-reduce", "4 MiB gradient all-reduce µs", "replica hash +µs per comparison",
                  "hash / gradient all-reduce"], rows)
    body += ("\n\nBusy steps (the CPU held, as a launch loop holds it); the slowest rank's mean. Target: `rt.check`, "
             "whose returned mean loss replaces the loop's own all-reduce, at most the cost of that all-reduce plus "
             "its judgement (a ratio near 1).")
    return Section("Training health check: cost per step", body, figures)
