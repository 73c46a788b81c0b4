"""1. Per-step cost of asking "should we stop?" on 2, 4 and 8 gloo ranks.

Comparators in the same processes: (a) a blocking all_gather of one flag per step (Megatron-LM's
DistributedSignalHandler.signals_received), (b) a blocking broadcast from rank 0 per step (Lightning), (c) the same
loop asking nothing. Reported: added critical-path time per step = (variant - empty) per step, on the slowest rank.
"""

from __future__ import annotations

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_stop_check_worker.py"


def run(quick: bool = False) -> Section:
    steps = 2000 if quick else 20000
    rows = []
    figures = {}
    for work_ms in (0.0, 1.0):
        for world in (2, 4, 8):
            # A 1 ms busy step on 8 ranks of a 2-core machine takes 4 ms: fewer steps keep the run short.
            count = steps if work_ms == 0 else max(1000, steps // 8)
            results = run_ranks(WORKER, world, [str(count), str(work_ms / 1000)])
            slowest = {k: max(r[k] for r in results) for k in results[0]}
            base = slowest["empty"]
            added = {k: (v - base) * 1e6 for k, v in slowest.items()}
            ratio = added["megatron_all_gather"] / max(added["slurmrt"], 1e-3)
            figures[f"{world}_ranks_{work_ms}ms"] = added
            rows.append([f"{world}", f"{work_ms:g} ms", f"{base * 1e6:.1f}", f"{added['megatron_all_gather']:.1f}",
                         f"{added['lightning_broadcast']:.1f}", f"{added['slurmrt']:.2f}", f"{ratio:.0f}x"])
    body = table(["ranks", "step work", "empty loop µs/step", "(a) all_gather +µs", "(b) broadcast +µs",
                  "slurmrt +µs", "(a) / slurmrt"], rows)
    body += (f"\n\n{steps} steps (0 ms) or {max(1000, steps // 8)} (1 ms) for the empty loop and slurmrt, 1/20 of "
             "that for the blocking collectives (each costs milliseconds here); second pass measured, slowest rank "
             "reported. Step work is a busy loop. Target: slurmrt at most 1/20 of (a) and under 5 µs per step.")
    return Section("Per-step cost of the stop check", body, figures)
