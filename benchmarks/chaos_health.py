"""A campaign of training-health faults on the simulator, each judged bit for bit.

    python -m benchmarks.chaos_health --seeds 5 --trials 20 --clean 2

Each trial is one job of ``slurmrt sim`` (3 nodes, a task on each, ``--requeue``: with 3 replicas the hash has a
majority that names the odd one) running the in-process restart's
worker (``tests/integration/inprocess_worker.py``: ``rt.check`` with the replicas every step, under
``run_restartable``), with one fault drawn from the seed, at a drawn step of a drawn task:

- ``nan``: the loss is NaN once (``--nan``): transient. Re-run; the step passes; the task's node is left out.
- ``nan-repeats``: NaN each time the step is reached (``--nan --nan-repeats``): reproducible. Re-run, then rewound to
  the certified checkpoint, its batches skipped.
- ``spike``: the loss of the step spikes, each time (``--spike``): reproducible, as ``nan-repeats``.
- ``flip``: a bit of the task's replicas flips (``--flip``), silent until the hash (every 4 steps): found, re-run
  from where the replicas last agreed, the node left out.

and, per seed, fault-free jobs of the same length (``--clean``). A trial is judged by the job's own records:

- **found**: its ``training_health`` events name the fault's step (a flip: the first comparison at or after it) as
  the first unhealthy one; a fault-free job has none (any is a **false positive**);
- **tainted resume**: a load after the fault that could hold its damage: a re-run that resumed at or after the
  faulty step (a flip: after the replicas last agreed), or a rewind that did not resume from the certified
  checkpoint it named;
- **weights**: the job's final weights against an uninterrupted run that skipped the batches its record skipped
  (none for a transient fault), bit for bit.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import ROOT, table

WORKER = ROOT / "tests" / "integration" / "inprocess_worker.py"
KINDS = ("nan", "nan-repeats", "spike", "flip")
HASH_EVERY = 4
TASKS = 3
#: Certified 3 healthy steps after a save (the default, 50, is longer than these jobs).
ENV = {"SLURMRT_HEALTH_CERTIFY_AFTER": "3", "SLURMRT_HEALTH_HASH_EVERY": str(HASH_EVERY), "OMP_NUM_THREADS": "1",
       "SLURMRT_WATCH_INTERVAL_S": "0.5"}


@dataclass(frozen=True)
class Trial:
    seed: int
    number: int
    kind: str  # one of KINDS, or "none"
    task: int = 0
    step: int = 0

    def sim_args(self) -> list[str]:
        at = f"{self.task}:{self.step}"
        return {"nan": ["--nan", at], "nan-repeats": ["--nan", at, "--nan-repeats"], "spike": ["--spike", at],
                "flip": ["--flip", at], "none": []}[self.kind]

    def worker_args(self) -> list[str]:
        """The same fault, made by the worker itself (where no ``slurmrt sim`` runs it: the test cluster): the first
        generation only (once) or every one (each time the step is reached), in the job's first run."""
        at = f"{self.task}:{self.step}"
        return {"nan": ["--nan", f"0:{at}"], "nan-repeats": ["--nan", f"*:{at}"], "spike": ["--spike", f"*:{at}"],
                "flip": ["--flip", f"0:{at}"], "none": []}[self.kind]

    @property
    def found_at(self) -> int:
        """The step the fault is found at: its own, or a flip's first comparison at or after it."""
        return -(-self.step // HASH_EVERY) * HASH_EVERY if self.kind == "flip" else self.step


def draw(seed: int, trials: int, clean: int, steps: int) -> list[Trial]:
    rng = random.Random(seed)
    drawn = []
    for n in range(trials):
        kind = KINDS[n % len(KINDS)]
        first = 25 if kind == "spike" else 5  # a spike is judged against 20 healthy losses at least
        last = steps - HASH_EVERY - 2 if kind == "flip" else steps - 2
        drawn.append(Trial(seed, n, kind, rng.randrange(TASKS), rng.randrange(first, last)))
    return drawn + [Trial(seed, trials + n, "none") for n in range(clean)]


#: Runs one job in ``directory`` (made here): the trial's fault (None: none) and the worker's extra arguments; returns
#: the job's exit code (0: it ended well) and its output.
Runner = Callable[[Path, "Trial | None", int, Sequence[str]], tuple[int, str]]


def sim_job(directory: Path, trial: Trial | None, steps: int, worker_args: Sequence[str] = ()) -> tuple[int, str]:
    out = run_sim(directory, trial.sim_args() if trial is not None else [], steps, worker_args)
    return out.returncode, out.stdout[-1500:] + out.stderr[-1500:]


def run_sim(directory: Path, args: list[str], steps: int,
            worker_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    directory.mkdir(parents=True)
    (directory / "local").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    env.update(ENV, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(directory), SLURMRT_CHECKPOINT_DIR=str(directory / "ckpt"),
               SLURMRT_LOCAL_CHECKPOINT_DIR=str(directory / "local"))
    command = [sys.executable, "-m", "slurmrt", "sim", "-N", str(TASKS), "--ntasks-per-node", "1", "--requeue", *args,
               "--", sys.executable, str(WORKER), "--out", str(directory / "out"), "--steps", str(steps), "--replicas",
               *worker_args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=directory, timeout=900)


def events(directory: Path) -> list[dict[str, Any]]:
    from slurmrt.record.events import read_events

    return [e for log in sorted((directory / "ckpt").glob("events-*.jsonl")) for e in read_events(log)]


def skips(directory: Path) -> tuple[tuple[int, int], ...]:
    """The steps the job's record skipped (``health.json``, read as slurmrt reads it)."""
    from slurmrt.health.record import read_record

    return tuple(read_record(directory / "ckpt").skips)


def tainted(trial: Trial, seen: list[dict[str, Any]]) -> list[str]:
    """The loads after a rung that could hold the fault's damage, in words."""
    bad, rung = [], None
    for e in seen:
        if e["event"] == "training_health":
            rung = e
        elif e["event"] == "resume" and rung is not None:
            step, fault = e["step"], rung["step"]
            if rung["action"] == "rewind" and step != rung["certified"]:
                bad.append(f"rewound to {rung['certified']} but resumed from {step}")
            elif rung["action"] == "rerun" and (step >= fault or (trial.kind == "flip" and step >= trial.step)):
                bad.append(f"re-run of step {fault} resumed from step {step}")
            rung = None
    return bad


def judge(trial: Trial, work: Path, steps: int, weights: dict[tuple[tuple[int, int], ...], Any],
          run: Runner = sim_job) -> dict[str, Any]:
    import torch

    directory = work / f"s{trial.seed}-t{trial.number}-{trial.kind}"
    code, said = run(directory, trial, steps, ())
    seen = events(directory)
    health = [e for e in seen if e["event"] == "training_health"]
    result: dict[str, Any] = {"trial": trial, "code": code, "unhealthy": len(health),
                              "tainted": tainted(trial, seen),
                              "left_out": [n for e in seen if e["event"] == "transient_fault" for n in e["nodes"]]}
    result["found"] = bool(health) and health[0]["step"] == trial.found_at if trial.kind != "none" else not health
    result["latency"] = health[0]["step"] - trial.step if health and trial.kind != "none" else None
    key = skips(directory)
    if key not in weights:
        weights[key] = _reference(work, key, steps, run)
    final = directory / "out" / "weights.pt"
    got = torch.load(final) if final.exists() else None
    want = weights[key]
    result["equal"] = got is not None and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    if code != 0 or not result["equal"]:
        result["why"] = said
    return result


def _reference(work: Path, skipped: tuple[tuple[int, int], ...], steps: int, run: Runner) -> Any:
    import torch

    assert len(skipped) <= 1, f"one fault per trial skips one range at most, not {skipped}"
    name = "reference" + "".join(f"-{a}-{b}" for a, b in skipped)
    code, said = run(work / name, None, steps, [f"--skip={a}-{b}" for a, b in skipped])
    if code != 0:
        raise SystemExit(f"the uninterrupted run {name} failed:\n{said}")
    return torch.load(work / name / "out" / "weights.pt")


def main(argv: list[str] | None = None, run: Runner = sim_job, description: str | None = __doc__) -> int:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=20, help="faulted jobs per seed")
    parser.add_argument("--clean", type=int, default=2, help="fault-free jobs per seed")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="keep the trials' directories here")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="slurmrt-health-"))
    work.mkdir(parents=True, exist_ok=True)
    trials = [t for s in range(args.first_seed, args.first_seed + args.seeds)
              for t in draw(s, args.trials, args.clean, args.steps)]
    weights: dict[tuple[tuple[int, int], ...], Any] = {(): _reference(work, (), args.steps, run)}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda t: judge(t, work, args.steps, weights, run), trials))
    print(report(results, time.monotonic() - started))
    return 0 if all(_passed(r) for r in results) else 1


def _passed(r: dict[str, Any]) -> bool:
    return r["code"] == 0 and r["found"] and not r["tainted"] and r["equal"]


def report(results: list[dict[str, Any]], seconds: float) -> str:
    rows = []
    for kind in (*KINDS, "none"):
        mine = [r for r in results if r["trial"].kind == kind]
        if not mine:
            continue
        latency = Counter(r["latency"] for r in mine if r["latency"] is not None)
        rows.append([kind, len(mine), len({r['trial'].seed for r in mine}),
                     sum(r["found"] for r in mine) if kind != "none" else "-",
                     sum(r["unhealthy"] > 0 for r in mine) if kind == "none" else "-",
                     sum(bool(r["tainted"]) for r in mine), sum(r["equal"] for r in mine),
                     sum(bool(r["left_out"]) for r in mine),
                     ", ".join(f"{k}: {v}" for k, v in sorted(latency.items())) or "-"])
    failed = [r for r in results if not _passed(r)]
    text = table(["fault", "jobs", "seeds", "found at its step", "false positives", "tainted resumes",
                  "weights bit for bit", "node left out", "latency in steps: jobs"], rows)
    text += f"\n\n{len(results)} jobs in {seconds:.0f} s; {len(failed)} failed"
    for r in failed:
        text += f"\n- {r['trial']}: code {r['code']}, found {r['found']}, tainted {r['tainted']}, equal {r['equal']}"
        text += f"\n{r.get('why', '')}"
    return text


if __name__ == "__main__":
    sys.exit(main())
