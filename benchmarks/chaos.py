"""A seeded fault campaign: real multi-rank training under ``slurmrt sim``, one fault per trial, drawn from a seed.

Each trial runs ``tests/integration/worker.py`` (deterministic gloo training, a checkpoint every few steps) as a
requeueable job of the simulator, injects one fault of a kind and at a moment drawn from the seed, lets the job
requeue and resume, and checks the invariants:

- **kept**: the final weights are bitwise those of an uninterrupted run of the same shape (every step applied once,
  no damaged checkpoint loaded);
- **not dead**: the job ended finished (it was requeued or restarted in the job, as it should be);
- **nothing left**: no process of the trial outlives it.

The faults (``KINDS``): a rank SIGKILLed or hung at a step, every rank dying at once, a node SIGKILLed (with and
without a spare under ``slurmrt run``), a task frozen by SIGSTOP, a preemption with a grace time. A trial that
breaks an invariant is reported with its seed and command, to become a regression test.

    python -m benchmarks.chaos --trials 24 --seed 1          # make chaos
    python -m benchmarks.chaos --trials 24 --seed 1 --only 5 --keep   # replay trial 5 alone, keep its files
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ._common import ROOT, machine, table

WORKER = ROOT / "tests" / "integration" / "worker.py"
STEPS, SAVE_EVERY, STEP_TIME = 60, 10, 0.05
NODES = 2
#: Fast detection, as the cluster tests use: a hung rank is named within seconds, not the default minutes.
ENV = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", "OMP_NUM_THREADS": "1"}
KINDS = ("rank-killed", "rank-hung", "all-ranks-die", "node-killed", "node-killed-spare", "task-frozen", "preempted")


@dataclass(frozen=True)
class Trial:
    number: int
    kind: str
    step: int  #: the training step a fault inside the worker hits
    at_s: float  #: seconds after the first checkpoint a fault from the simulator hits
    target: int  #: the rank or node it hits

    def sim_args(self) -> list[str]:
        nodes = NODES + (1 if self.kind == "node-killed-spare" else 0)
        args = ["-N", str(nodes), "--ntasks-per-node", "1", "--requeue", "--max-restarts", "4"]
        timed = ["--at", f"{self.at_s:.2f}", "--after-checkpoint"]
        return args + {
            "node-killed": ["--fail-node", str(self.target), *timed],
            "node-killed-spare": ["--no-kill", "--fail-node", str(self.target), *timed],  # its script: slurmrt run
            "task-frozen": ["--hang-task", str(self.target), *timed],
            "preempted": ["--preempt-at", f"{self.at_s:.2f}", "--after-checkpoint", "--grace", "10",
                          "--signal", "USR1@5"],
        }.get(self.kind, [])

    def worker_args(self) -> list[str]:
        return {
            "rank-killed": ["--fault", "kill", "--fault-at", str(self.step), "--fault-rank", str(self.target)],
            "rank-hung": ["--fault", "hang", "--fault-at", str(self.step), "--fault-rank", str(self.target)],
            "all-ranks-die": ["--die-at", str(self.step)],
        }.get(self.kind, [])


def draw(seed: int, trials: int) -> list[Trial]:
    """The campaign of ``seed``: kinds in turn (each as often as the others), moments and targets at random."""
    rng = random.Random(seed)
    return [Trial(n, KINDS[n % len(KINDS)], rng.randint(SAVE_EVERY + 1, STEPS - 5), rng.uniform(0.0, 1.5),
                  rng.randrange(NODES)) for n in range(trials)]


def batch_script(directory: Path, trial: Trial) -> Path:
    """The job as users write it: srun the training, requeue on a failure slurmrt could not answer itself."""
    worker = [sys.executable, str(WORKER), "--out", f"{directory}/run${{SLURM_RESTART_COUNT:-0}}", "--steps",
              str(STEPS), "--step-time", str(STEP_TIME), "--save-every", str(SAVE_EVERY), *trial.worker_args()]
    command = " ".join(shlex.quote(a) if "$" not in a else f'"{a}"' for a in worker)
    script = directory / "job.sbatch"
    if trial.kind == "node-killed-spare":
        body = f"exec {shlex.quote(sys.executable)} -m slurmrt run --spare-nodes 1 -- {command}"
    else:
        body = "\n".join([f"srun --kill-on-bad-exit=1 {command}", "rc=$?",
                          'case $rc in 0|1|2|3|4) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', "exit $rc"])
    script.write_text(f"#!/bin/bash\nexport SLURMRT_CHECKPOINT_DIR={directory}/ckpt\n{body}\n")
    return script


def final_weights(directory: Path) -> list[float] | None:
    """Rank 0's weights at the end of the job's last step (the run or in-job step that wrote last)."""
    outs = [p for p in directory.glob("run*/rank0.json")]
    if not outs:
        return None
    last = max(outs, key=lambda p: p.stat().st_mtime_ns)
    return list(json.loads(last.read_text())["w"])


def leftovers(directory: Path) -> list[int]:
    """Processes still running whose command line names the trial's directory."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(directory) in part for part in proc.info["cmdline"] or []):
            found.append(proc.info["pid"])
    return found


def run_sim(directory: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    env.update(ENV, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(directory))
    return subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], capture_output=True, text=True, env=env,
                          cwd=directory, timeout=timeout_s)


def reference(work: Path) -> list[float]:
    """The weights of an uninterrupted run of the same shape."""
    directory = work / "reference"
    directory.mkdir()
    out = run_sim(directory, ["-N", str(NODES), "--ntasks-per-node", "1", "--", str(batch_script(
        directory, Trial(-1, "none", 0, 0.0, 0)))], 600)
    weights = final_weights(directory)
    if out.returncode != 0 or weights is None:
        raise SystemExit(f"the uninterrupted reference run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return weights


def judge(trial: Trial, work: Path, expected: list[float], timeout_s: float) -> tuple[str, str]:
    """(verdict, detail) of one trial: survived, lost (weights differ), dead (not finished), leftover, timeout."""
    directory = work / f"trial-{trial.number:04d}-{trial.kind}"
    directory.mkdir()
    args = [*trial.sim_args(), "--", str(batch_script(directory, trial))]
    try:
        out = run_sim(directory, args, timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout", f"no end within {timeout_s:.0f} s"
    left = leftovers(directory)
    weights = final_weights(directory)
    if out.returncode != 0:
        return "dead", (out.stdout + out.stderr)[-1500:]
    if weights != expected:
        return "lost", f"final weights {weights} != uninterrupted {expected}"
    if left:
        return "leftover", f"processes {left} outlived the job"
    return "survived", ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=len(KINDS) * 4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one trial may take")
    p.add_argument("--keep", action="store_true", help="keep the trials' directories")
    p.add_argument("--only", type=int, action="append", help="run only this trial of the campaign (repeatable)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slurmrt-chaos-"))
    started = time.monotonic()
    verdicts: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    try:
        expected = reference(work)
        for trial in draw(args.seed, args.trials):
            if args.only and trial.number not in args.only:
                continue
            verdict, detail = judge(trial, work, expected, args.timeout)
            verdicts[(trial.kind, verdict)] += 1
            print(f"trial {trial.number} {trial.kind} (step {trial.step}, at {trial.at_s:.2f} s, target "
                  f"{trial.target}): {verdict}", flush=True)
            if verdict != "survived":
                failures.append(f"seed {args.seed} trial {trial.number} {trial.kind}: {verdict}: {detail}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = [[kind, sum(n for (k, _), n in verdicts.items() if k == kind)] +
            [verdicts[(kind, v)] for v in ("survived", "lost", "dead", "leftover", "timeout")] for kind in KINDS]
    print(f"\n{machine()}; seed {args.seed}, {args.trials} trials in {time.monotonic() - started:.0f} s; "
          f"command: python -m benchmarks.chaos --trials {args.trials} --seed {args.seed}\n")
    print(table(["fault", "injected", "survived", "lost", "dead", "leftover", "timeout"], rows))
    for failure in failures:
        print(f"\n{failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
