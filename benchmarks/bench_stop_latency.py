"""2. Stop latency: steps and seconds between a signal reaching one random rank and every rank stopping."""

from __future__ import annotations

import statistics

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_stop_latency_worker.py"


def run(quick: bool = False) -> Section:
    trials = 15 if quick else 50
    rows = []
    figures = {}
    for world, step_ms in ((4, 20), (8, 20), (4, 100), (4, 1000)):
        count = max(5, trials // 5) if step_ms >= 1000 else trials
        results = run_ranks(WORKER, world, [str(count), str(step_ms / 1000)], timeout=900)
        episodes = results[0]
        same = sum(1 for e in episodes if len(e["stops"]) == 1)
        latencies = [e["stops"][0] - e["signal_step"] for e in episodes if len(e["stops"]) == 1]
        seconds = [e["seconds"] for e in episodes if len(e["stops"]) == 1]
        within = sum(1 for x in seconds if x <= 2.0)
        figures[f"{world}x{step_ms}ms"] = {"same_step": same, "within_2s": within, "latencies": latencies,
                                           "seconds": seconds}
        rows.append([world, f"{step_ms} ms", f"{same}/{len(episodes)}", f"{within}/{len(episodes)}",
                     f"{statistics.median(latencies):.0f}", max(latencies), f"{statistics.median(seconds):.2f}",
                     f"{max(seconds):.2f}"])
    body = table(["ranks", "step", "all ranks at the same step", "within 2 s", "median steps", "max steps",
                  "median s", "max s"], rows)
    body += ("\n\nLatency counts from the step in progress on the signalled rank when the signal lands to the step at "
             "which every rank stops, and from the signal to the last rank's stop in seconds. The agreement's rounds "
             "are paced by the stop latency a job needs (every 0.5 to 1 s), not by its step time: fast steps take "
             "more steps to stop, never more than a round and a half. Target: every trial at the same step, within "
             "2 s.")
    return Section("Stop latency", body, figures)
