"""2. Stop latency: steps between a signal reaching one random rank and every rank stopping, over 50 trials."""

from __future__ import annotations

import statistics

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_stop_latency_worker.py"


def run(quick: bool = False) -> Section:
    trials = 15 if quick else 50
    rows = []
    figures = {}
    for world, step_ms in ((4, 20), (8, 20), (4, 100)):
        results = run_ranks(WORKER, world, [str(trials), str(step_ms / 1000)], timeout=900)
        episodes = results[0]
        same = sum(1 for e in episodes if len(e["stops"]) == 1)
        latencies = [e["stops"][0] - e["signal_step"] for e in episodes if len(e["stops"]) == 1]
        within = sum(1 for x in latencies if x <= 2)
        figures[f"{world}x{step_ms}ms"] = {"same_step": same, "within_2": within, "latencies": latencies}
        rows.append([world, f"{step_ms} ms", f"{same}/{len(episodes)}", f"{within}/{len(episodes)}",
                     f"{statistics.median(latencies):.0f}", max(latencies)])
    body = table(["ranks", "step", "all ranks at the same step", "within 2 steps", "median steps", "max steps"], rows)
    body += ("\n\nLatency counts from the step in progress on the signalled rank when the signal lands to the step at "
             "which every rank stops. Target: every trial at the same step, within 2 steps.")
    return Section("Stop latency", body, figures)
