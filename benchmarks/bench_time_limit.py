"""3. Time-limit accuracy: does the last checkpoint land before the kill, how much time is left unused, how much
work is lost -- slurmrt's deadline against the rules people use today.

Simulated job trains on a virtual clock (no sleeping), 50 trials, each a 4-hour job:
- step times jitter between 0.2 and 2 s around a per-job mean, with 1 step in 200 taking 5-20x longer
  (data-loader stalls, checkpoint I/O of other jobs);
- a save takes 60-240 s (per job), +-20 % per save; periodic checkpoints every 30 minutes;
- the job starts training after a start-up of 1-8 minutes (imports, data, model build);
- Slurm sends SIGTERM at the time limit and SIGKILL 30 s later (KillWait).

Policies:
- slurmrt: the library's own DurationEstimator, PeriodicSaves and time_is_short (3 steps ahead, as with several
  ranks), the margin at its default of 30 s, the save time measured from the periodic saves;
- `--signal=USR1@120`: stop at the first step after the signal, which Slurm sends 120-180 s before the end;
- Megatron `--exit-duration-in-mins`: stop once the training has run (limit - 10 min), timed from the process start,
  as its users commonly set it for a fixed time limit.
Success: the final save completes before SIGKILL. Work lost on failure: back to the last periodic checkpoint.
"""

from __future__ import annotations

import random
import statistics

from slurmrt.stop.deadline import DurationEstimator, PeriodicSaves, budget_saves, time_is_short

from ._common import Section, table

LIMIT_S = 4 * 3600.0
KILL_WAIT_S = 30.0
PERIODIC_S = 1800.0


def _job(rng: random.Random, policy: str) -> tuple[bool, float, float]:
    """(saved in time, seconds unused at the end, seconds of work lost)."""
    mean_step = rng.uniform(0.3, 1.5)
    save_mean = rng.uniform(60, 240)
    startup = rng.uniform(60, 480)
    signal_at = LIMIT_S - 120 - rng.uniform(0, 60)
    steps = DurationEstimator(window=64, skip=2, quantile=0.95)
    saves = DurationEstimator(window=4, quantile=1.0, default=30.0)
    periodic = PeriodicSaves()
    now = startup
    last_ckpt = startup
    next_periodic = startup + PERIODIC_S

    def save_time() -> float:
        return save_mean * rng.uniform(0.8, 1.2)

    while True:
        step = min(2.0, max(0.2, rng.gauss(mean_step, mean_step * 0.2)))
        if rng.random() < 1 / 200:
            step *= rng.uniform(5, 20)
        now += step
        steps.add(step)
        if now >= LIMIT_S + KILL_WAIT_S:
            return False, 0.0, now - last_ckpt
        if policy == "slurmrt":
            kw = {"now": now, "step_s": steps.estimate(), "steps_ahead": 3, "save_s": saves.estimate() or 0.0,
                  "margin_s": 30.0, "worst_step_s": steps.peak}
            stop = time_is_short(end=LIMIT_S, saves=budget_saves(periodic, **kw), **kw)
        elif policy == "signal":
            stop = now >= signal_at
        else:  # megatron
            stop = now - startup >= LIMIT_S - 600
        if stop:
            done = now + save_time()
            if done <= LIMIT_S + KILL_WAIT_S:
                return True, max(0.0, LIMIT_S - done), 0.0
            return False, 0.0, LIMIT_S + KILL_WAIT_S - last_ckpt
        if now >= next_periodic:
            took = save_time()
            periodic.saved(now)
            saves.add(took)
            now += took
            last_ckpt = now
            next_periodic = now + PERIODIC_S


def run(quick: bool = False) -> Section:
    trials = 50
    rows = []
    figures = {}
    for policy, label in (("slurmrt", "slurmrt deadline"), ("signal", "--signal=USR1@120"),
                          ("megatron", "--exit-duration-in-mins = limit - 10")):
        rng = random.Random(20261121)  # the same 50 jobs for every policy
        results = [_job(rng, policy) for _ in range(trials)]
        ok = [r for r in results if r[0]]
        unused = [r[1] / 60 for r in ok]
        lost = [r[2] / 60 for r in results if not r[0]]
        figures[policy] = {"saved": len(ok), "unused_min": unused, "lost_min": lost}
        rows.append([label, f"{len(ok)}/{trials}",
                     f"{statistics.median(unused):.1f}" if unused else "-",
                     f"{max(unused):.1f}" if unused else "-",
                     f"{sum(lost):.0f}" if lost else "0"])
    body = table(["policy", "saved before SIGKILL", "median unused min", "max unused min",
                  "work lost, min (all trials)"], rows)
    return Section("Time-limit accuracy", body, figures)
