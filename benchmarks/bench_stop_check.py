"""1. Per-step cost of asking "should we stop?" on 2, 4 and 8 gloo ranks, and the CPU the agreement thread takes.

Comparators in the same processes: (a) a blocking all_gather of one flag per step (Megatron-LM's
DistributedSignalHandler.signals_received), (b) a blocking broadcast from rank 0 per step (Lightning), (c) the same
loop asking nothing, measured first, before slurmrt's agreement thread exists (a clean baseline). Reported: added
critical-path time per step = (variant - empty) per step, on the slowest rank; and the extra CPU of the process while
slurmrt's loop runs against the empty loop, in percent of one core (mean over the ranks).
"""

from __future__ import annotations

from statistics import mean

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_stop_check_worker.py"


def run(quick: bool = False) -> Section:
    rows, cpu_rows = [], []
    figures: dict[str, object] = {}
    # Per-step cost: a 0 or 1 ms busy step (Python holding the GIL, as a GPU launch loop does).
    for work_ms in (0.0, 1.0):
        for world in (2, 4, 8):
            steps = (2000 if quick else 20000) if work_ms == 0 else (300 if quick else 2500)
            results = run_ranks(WORKER, world, [str(steps), str(work_ms / 1000), "busy"])
            slowest = {k: max(r[k]["step_s"] for r in results) for k in results[0]}
            base = slowest["empty"]
            added = {k: (v - base) * 1e6 for k, v in slowest.items()}
            ratio = added["megatron_all_gather"] / max(added["slurmrt"], 1e-3)
            share = added["slurmrt"] / (base * 1e6) * 100 if work_ms else None
            figures[f"{world}_ranks_{work_ms}ms"] = added
            rows.append([f"{world}", f"{work_ms:g} ms", f"{base * 1e6:.1f}", f"{added['megatron_all_gather']:.1f}",
                         f"{added['lightning_broadcast']:.1f}", f"{added['slurmrt']:.2f}",
                         "-" if share is None else f"{share:.2f} %", f"{ratio:.0f}x"])
    # The agreement thread's CPU: steps that sleep (the GPU works, the CPU waits), 10 and 100 ms.
    for step_ms in (10, 100):
        for world in (2, 4):
            steps = max(20, int((6 if quick else 30) / (step_ms / 1000)))
            results = run_ranks(WORKER, world, [str(steps), str(step_ms / 1000), "sleep"])
            extra = mean(r["slurmrt"]["cpu"] - r["empty"]["cpu"] for r in results) * 100
            own = mean(r["slurmrt"]["slurmrt_threads_cpu"] for r in results) * 100
            main = mean(r["slurmrt"]["main_cpu"] - r["empty"]["main_cpu"] for r in results) * 100
            window = results[0]["slurmrt"]["window"]
            figures[f"cpu_{world}_ranks_{step_ms}ms"] = extra
            figures[f"threads_cpu_{world}_ranks_{step_ms}ms"] = own
            cpu_rows.append([world, f"{step_ms} ms", steps, f"{own:.2f} %", f"{main:+.2f} %", f"{extra:.2f} %",
                             f"{window:.0f}"])
    body = table(["ranks", "step work", "empty loop µs/step", "(a) all_gather +µs", "(b) broadcast +µs",
                  "slurmrt +µs", "slurmrt / step", "(a) / slurmrt"], rows)
    body += ("\n\nBusy steps; the empty loop is measured before slurmrt's agreement thread starts. Target: slurmrt "
             "under 1 % of a 1 ms step, and at most 1/20 of (a).\n\n")
    body += table(["ranks", "step (sleeping)", "steps", "slurmrt's threads, % of a core per rank",
                   "training thread, extra", "whole process, extra", "clearance window (steps)"], cpu_rows)
    body += ("\n\nslurmrt's threads: the CPU its own threads ran while the loop called `should_stop` every step, read "
             "from each thread's scheduler statistics in nanoseconds: the agreement thread and every thread born "
             "after the baseline (the gloo event loops of its trees and of its lazy work group, their workers). "
             "Training thread, extra: what the loop's own thread ran more than in the same loop asking nothing. "
             "Whole process, extra: the process's CPU against the same loop asking nothing, measured in the phase "
             "before (a difference of two totals, each with the program's own threads in it, so it also carries "
             "their moves). Mean of the ranks. Target: at most 1 % of a core.")
    return Section("Per-step cost of the stop check", body, figures)
