"""14. The in-process restart against the new step: from a fault to the first step of the training that follows.

One training script (tests/integration/inprocess_worker.py: 2 ranks, gloo, ``slurmrt.run_restartable(rt, train)``,
a local-tier save every step and a shared one every 5) under ``slurmrt run`` in ``slurmrt sim`` (2 nodes of 1
task, no spare), RUNS jobs of each fault, alternated:

- *raise*: rank 1 raises a ``RuntimeError`` after step 12's update; its process lives, so every rank restarts the
  training function in the same process (a new default group, the agreement and slurmrt's groups rebuilt, the
  newest checkpoint loaded from the local tier);
- *kill*: rank 1's process SIGKILLs itself at the same point; the survivor gives up its rejoin as soon as srun says
  the task ended, and ``slurmrt run`` starts a new step on the same nodes, whose processes start, import torch, form
  the group and load.

Per job: from the fault (the faulting rank prints the moment) to the moment every rank has finished its first step
after it (each rank prints it). The figure is the median over the jobs, and the largest.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import ROOT, Section, table

WORKER = ROOT / "tests" / "integration" / "inprocess_worker.py"
RUNS = 5
STEP = 12
_FAULT = re.compile(r"worker: fault \w+ on rank \d+ at ([0-9.]+)")
_FIRST = re.compile(r"worker: first step (\d+) of generation (\d+) done at ([0-9.]+)")


def _job(work: Path, fault: str) -> dict[str, Any]:
    """One sim job with ``fault`` ("raise" or "kill"); the fault to every rank's first step after it."""
    work.mkdir(parents=True)
    (work / "local").mkdir()
    flag = "--fail" if fault == "raise" else "--kill"
    script = work / "job.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"export SLURMRT_CHECKPOINT_DIR={work}/ckpt SLURMRT_LOCAL_CHECKPOINT_DIR={work}/local\n"
        f"exec {sys.executable} -m slurmrt run -- {sys.executable} {WORKER} --out {work}/out --steps 40 "
        f"{flag} 0:1:{STEP}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    done = subprocess.run([sys.executable, "-m", "slurmrt", "sim", "-N", "2", "--ntasks-per-node", "1", str(script)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"the {fault} job ended {done.returncode}:\n{out[-3000:]}")
    moment = float(_FAULT.findall(out)[0])
    firsts = [float(t) for _, _, t in _FIRST.findall(out) if float(t) > moment]
    if len(firsts) < 2:
        raise RuntimeError(f"the {fault} job: fewer than 2 ranks reported a step after the fault:\n{out[-3000:]}")
    generations = [int(g) for _, g, t in _FIRST.findall(out) if float(t) > moment]
    return {"to_step": sorted(firsts)[1] - moment, "in_process": all(g == 1 for g in generations),
            "new_steps": out.count("slurmrt run:   new step:")}


def run(quick: bool = False) -> Section:
    runs = 2 if quick else RUNS
    got: dict[str, list[dict[str, Any]]] = {"raise": [], "kill": []}
    with tempfile.TemporaryDirectory(prefix="slurmrt-bench-inprocess-") as tmp:
        for n in range(runs):
            for fault in ("raise", "kill"):
                got[fault].append(_job(Path(tmp) / f"{fault}{n}", fault))
                print(f"  {fault} {n}: {got[fault][-1]['to_step']:.2f} s", file=sys.stderr, flush=True)
    rows, figures = [], {}
    for fault, path in (("raise", "in the process"), ("kill", "a new step")):
        times = [j["to_step"] for j in got[fault]]
        med = statistics.median(times)
        figures[fault] = med
        rows.append([f"rank 1 {'raises' if fault == 'raise' else 'is SIGKILLed'}", path, len(times),
                     f"{med:.2f}", f"{max(times):.2f}", sum(j["new_steps"] for j in got[fault]),
                     sum(j["in_process"] for j in got[fault])])
    ratio = figures["kill"] / figures["raise"]
    body = table(["fault", "restart", "jobs", "fault to first step s (median)", "max s", "new steps",
                  "jobs restarted in the process"], rows)
    body += (f"\n\nThe new step took {ratio:.1f}x the in-process restart's time (medians), the same script, machine "
             "and run.")
    figures["ratio"] = ratio
    return Section("In-process restart against a new step", body, figures)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv).body)
