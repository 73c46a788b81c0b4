"""A seeded fault campaign: real multi-rank training under ``slurmrt sim``, faults drawn from a seed.

Each trial runs ``tests/integration/worker.py`` (deterministic gloo training, a checkpoint every few steps) as a
requeueable job of the simulator, injects one fault of a kind and at a moment drawn from the seed (or, with
``--mtbf``, many: the simulator's injector draws them), lets the job requeue and resume, and checks the invariants:

- **kept**: the final weights are bitwise those of an uninterrupted run of the same shape (every step applied once,
  no damaged checkpoint loaded);
- **not dead**: the job ended finished (it was requeued or restarted in the job, as it should be);
- **nothing left**: no process of the trial outlives it.

The faults (``KINDS``): a rank SIGKILLed or hung at a step, every rank dying at once, a node SIGKILLed (with and
without a spare under ``slurmrt run``), a task frozen by SIGSTOP, a preemption with a grace time. A trial that
breaks an invariant is reported with its seed and command, to become a regression test. With ``--mtbf``, every
other trial is `slurmrt run --spare-nodes 1` with a node-local tier saved every 5 steps and slow shared saves, so
that faults also land inside saves, the helper, the replication to the partner node and the loads; the kinds are
the simulator's (:mod:`slurmrt.sim.faults`), signal storms included.

    python -m benchmarks.chaos --trials 24 --seed 1          # make chaos
    python -m benchmarks.chaos --mtbf 1.5s --trials 400 --faults 1000 --jobs 12   # many faults, 12 trials at once
    python -m benchmarks.chaos --trials 24 --seed 1 --only 5 --keep   # replay trial 5 alone, keep its files
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from slurmrt.record.events import read_events
from slurmrt.sim.faults import KINDS as SIM_KINDS
from slurmrt.sim.faults import Fault, parse_duration, parse_weights, write_trace
from slurmrt.sim.faults import draw as draw_faults

from ._common import ROOT, machine, table
from .chaos_moments import PHASES, Met
from .chaos_moments import read as read_met

WORKER = ROOT / "tests" / "integration" / "worker.py"
STEPS, SAVE_EVERY, STEP_TIME = 60, 10, 0.05
#: The training of a trial of many faults (--mtbf): long enough for several.
MTBF_STEPS = 240
VERDICTS = ("survived", "lost", "dead", "leftover", "timeout")
#: The simulator's lines for the faults it injects, for a trial cut short before its summary.
SAID = {"rank-crash": " crashes: SIGKILL", "hang": " hangs: SIGSTOP", "node-loss": "slurmrt sim: node ",
        "preemption": " preempted: grace time", "signal-storm": "slurmrt sim: a signal storm"}
NODES = 2
#: Fast detection, as the cluster tests use: a hung rank is named within seconds, not the default minutes.
ENV = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", "OMP_NUM_THREADS": "1"}
KINDS = ("rank-killed", "rank-hung", "all-ranks-die", "node-killed", "node-killed-spare", "task-frozen", "preempted")
#: Trials whose job is `slurmrt run --spare-nodes 1` on one node more, in a --no-kill allocation.
IN_JOB = ("node-killed-spare", "mixed-in-job")
#: The simulator's draw in trials of many faults: its default weights, and signal storms as often as preemptions.
MTBF_WEIGHTS = "node-loss=4,rank-crash=3,hang=2,preemption=1,signal-storm=1"


@dataclass(frozen=True)
class Trial:
    number: int
    kind: str
    step: int  #: the training step a fault inside the worker hits
    at_s: float  #: seconds after the first checkpoint a fault from the simulator hits
    target: int  #: the rank or node it hits
    #: A trial of many faults: the simulator draws them with this mean time between failures (of training time).
    mtbf: str | None = None
    seed: int = 0

    def sim_args(self, directory: Path) -> list[str]:
        """The simulator's options; a fault from outside the job is a one-line trace for the simulator's injector
        (slurmrt.sim.faults), counted from the first checkpoint."""
        nodes = NODES + (1 if self.kind in IN_JOB else 0)
        if self.mtbf is not None:  # the simulator's injector, on training time; every run resumes and goes on
            mtbf_s = parse_duration(self.mtbf)
            faults = draw_faults(mtbf_s, self.seed, horizon_s=mtbf_s * 1000, weights=parse_weights(MTBF_WEIGHTS))
            trace = directory / "trace.csv"
            write_trace(trace, faults)  # node losses on any node: the first one's is the guard job's to requeue
            # a preemption sends its warning at once, as Slurm's preempt_send_user_signal does: none is shielded
            return ["-N", str(nodes), "--ntasks-per-node", "1", "--trace", str(trace), "--after-checkpoint",
                    "--signal", "USR1@5", "--grace", "10", *(["--no-kill"] if self.kind in IN_JOB else [])]
        args = ["-N", str(nodes), "--ntasks-per-node", "1", "--requeue", "--max-restarts", "4"]
        injected = {"node-killed": "node-loss", "node-killed-spare": "node-loss", "task-frozen": "hang",
                    "preempted": "preemption"}.get(self.kind)
        if injected is None:
            return args
        trace = directory / "trace.csv"
        fault = Fault(round(self.at_s, 2), injected, self.target)
        write_trace(trace, [fault])
        args += ["--trace", str(trace), "--after-checkpoint"]
        if self.kind == "node-killed-spare":
            args.append("--no-kill")  # its script: slurmrt run --spare-nodes 1
        if self.kind == "preempted":
            args += ["--grace", "10", "--signal", "USR1@5"]
        return args

    def worker_args(self) -> list[str]:
        return {
            "rank-killed": ["--fault", "kill", "--fault-at", str(self.step), "--fault-rank", str(self.target)],
            "rank-hung": ["--fault", "hang", "--fault-at", str(self.step), "--fault-rank", str(self.target)],
            "all-ranks-die": ["--die-at", str(self.step)],
            # Local saves every 5 steps (replicated to the partner node) and slow shared ones: faults land inside
            # saves, the save helper, the replication and the loads.
            "mixed-in-job": ["--local-every", "5", "--slow-save", "0.05"],
        }.get(self.kind, [])


def draw(seed: int, trials: int, mtbf: str | None = None) -> list[Trial]:
    """The campaign of ``seed``: kinds in turn (each as often as the others), moments and targets at random; with
    ``mtbf``, trials of many faults each, drawn by the simulator from a seed of each trial's."""
    rng = random.Random(seed)
    if mtbf is not None:
        return [Trial(n, ("mixed", "mixed-in-job")[n % 2], 0, 0.0, 0, mtbf=mtbf, seed=seed * 100_003 + n)
                for n in range(trials)]
    return [Trial(n, KINDS[n % len(KINDS)], rng.randint(SAVE_EVERY + 1, STEPS - 5), rng.uniform(0.0, 1.5),
                  rng.randrange(NODES)) for n in range(trials)]


def batch_script(directory: Path, trial: Trial, steps: int = STEPS) -> Path:
    """The job as users write it: srun the training, requeue on a failure slurmrt could not answer itself."""
    worker = [sys.executable, str(WORKER), "--out", f"{directory}/run${{SLURM_RESTART_COUNT:-0}}", "--steps",
              str(steps), "--step-time", str(STEP_TIME), "--save-every", str(SAVE_EVERY), *trial.worker_args()]
    command = " ".join(shlex.quote(a) if "$" not in a else f'"{a}"' for a in worker)
    script = directory / "job.sbatch"
    if trial.kind in IN_JOB:
        body = f"exec {shlex.quote(sys.executable)} -m slurmrt run --spare-nodes 1 -- {command}"
        if trial.kind == "mixed-in-job":  # a node-local tier: each node's own directory under it
            body = f"mkdir -p {directory}/local\nexport SLURMRT_LOCAL_CHECKPOINT_DIR={directory}/local\n{body}"
    else:
        body = "\n".join([f"srun --kill-on-bad-exit=1 --wait=60 {command}", "rc=$?",
                          'case $rc in 0|1|2|3|4|78) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', "exit $rc"])
    script.write_text(f"#!/bin/bash\nexport SLURMRT_CHECKPOINT_DIR={directory}/ckpt\n{body}\n")
    return script


def final_weights(directory: Path) -> list[float] | None:
    """Rank 0's weights at the end of the job's last step (the run or in-job step that wrote last)."""
    outs = [p for p in directory.glob("run*/rank0.json")]
    if not outs:
        return None
    last = max(outs, key=lambda p: p.stat().st_mtime_ns)
    return list(json.loads(last.read_text())["w"])


def from_scratch(directory: Path) -> str | None:
    """A run that started fresh after a shared checkpoint was committed (its event logs say so): work thrown away
    that a deterministic training's final weights cannot show. None when every run resumed as it should."""
    for log in sorted((directory / "ckpt").glob("events-*.jsonl")):
        saved = False
        for e in read_events(log):
            saved = saved or (e.get("event") == "save" and e.get("tier", "shared") != "local")
            if e.get("event") == "fresh_start" and saved:
                return f"{log.name}: a fresh start after a committed checkpoint: {e}"
    return None


def continuity(directory: Path) -> str | None:
    """What a deterministic training's final weights cannot name: a run that resumed from an older checkpoint than
    the newest shared one committed before it, or whose first step was not the one after the checkpoint it loaded
    (a step skipped or applied twice). Read from the event logs: rank 0's first ``progress`` event of a run is its
    first step. None when every run went on where it should."""
    from slurmrt.record.events import Event
    from slurmrt.record.runs import runs_of

    for log in sorted((directory / "ckpt").glob("events-*.jsonl")):
        newest: int | None = None  # the newest shared checkpoint committed so far
        for run in runs_of(log):
            resumed = run.first(Event.RESUME)
            loaded = resumed.get("step") if resumed is not None else None
            if isinstance(loaded, int) and newest is not None and loaded < newest:
                return f"{log.name}: run {run.restart}.{run.attempt} resumed from step {loaded}, older than " \
                       f"the newest committed checkpoint, step {newest}"
            first = next((e.get("step") for e in run.all(Event.PROGRESS) if isinstance(e.get("step"), int)), None)
            began = loaded + 1 if isinstance(loaded, int) else 0
            if first is not None and (resumed is not None or run.first(Event.FRESH_START) is not None) \
                    and first != began:
                return f"{log.name}: run {run.restart}.{run.attempt} loaded step {loaded} and trained first step " \
                       f"{first}, not {began}: " + ("a step skipped" if first > began else "a step applied twice")
            shared = [e.get("step") for e in run.all(Event.SAVE) if e.get("tier", "shared") != "local"]
            newest = max([s for s in shared if isinstance(s, int)] + ([newest] if newest is not None else []),
                         default=None)
    return None


def finished(directory: Path) -> bool:
    """The job's last run recorded that its training finished (exit code 0): a job that Slurm then ended otherwise
    (its batch node lost while it tore down) lost nothing, and nothing had to requeue it."""
    from slurmrt.record.events import Event
    from slurmrt.record.runs import runs_of

    log = next(iter(sorted((directory / "ckpt").glob("events-*.jsonl"))), None)  # one job: one event log
    last = runs_of(log)[-1:]
    ended = last[0].first(Event.EXIT) if last else None
    return ended is not None and ended.get("code") == 0


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


def reference(work: Path, steps: int) -> list[float]:
    """The weights of an uninterrupted run of the same shape."""
    directory = work / "reference"
    directory.mkdir()
    out = run_sim(directory, ["-N", str(NODES), "--ntasks-per-node", "1", "--", str(batch_script(
        directory, Trial(-1, "none", 0, 0.0, 0), steps))], 600)
    weights = final_weights(directory)
    if out.returncode != 0 or weights is None:
        raise SystemExit(f"the uninterrupted reference run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return weights


INJECTED = re.compile(r"^faults \(.*?\): (\d+) injected \((.*?)\)", re.M)


def injected(trial: Trial, stdout: str) -> Counter[str]:
    """The faults the trial injected, by kind: its one fault, or what the simulator's trace line counts."""
    if trial.mtbf is None:
        return Counter({trial.kind: 1})
    found = INJECTED.search(stdout)
    if found is None:  # cut short: count what the simulator said it did
        return Counter({kind: n for kind, said in SAID.items()
                        if (n := sum(said in line for line in stdout.splitlines() if "slurmrt sim:" in line))})
    if found[2] == "none":
        return Counter()
    return Counter({kind: int(n) for n, kind in (part.split(" ", 1) for part in found[2].split(", "))})


def judge(trial: Trial, work: Path, expected: list[float], timeout_s: float, steps: int
          ) -> tuple[str, str, Counter[str]]:
    """(verdict, detail, faults injected by kind) of one trial: survived, lost (weights differ), dead (not
    finished), leftover, timeout."""
    directory = work / f"trial-{trial.number:04d}-{trial.kind}"
    directory.mkdir()
    args = [*trial.sim_args(directory), "--", str(batch_script(directory, trial, steps))]
    try:
        out = run_sim(directory, args, timeout_s)
    except subprocess.TimeoutExpired as err:
        partial = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout or ""
        (directory / "sim.out").write_text(partial)
        return "timeout", f"no end within {timeout_s:.0f} s", injected(trial, partial)
    (directory / "sim.out").write_text(out.stdout + out.stderr)  # kept with --keep
    return (*verdict(directory, expected, out.returncode, out.stdout + out.stderr), injected(trial, out.stdout))


def verdict(directory: Path, expected: list[float], returncode: int, output: str) -> tuple[str, str]:
    """(verdict, detail) of a trial that ended, from what it left in ``directory``: dead (the job failed and its
    training did not finish), lost (the final weights differ from the uninterrupted run's, a fresh start after a
    committed checkpoint, a resume from an older checkpoint than the newest, a step skipped or applied twice),
    leftover (a process outlived the job), or survived."""
    if returncode != 0 and not finished(directory):
        return "dead", output[-1500:]
    weights = final_weights(directory)
    if weights != expected:
        return "lost", f"final weights {weights} != uninterrupted {expected}"
    for wrong in (from_scratch(directory), continuity(directory)):
        if wrong is not None:
            return "lost", wrong
    left = leftovers(directory)
    if left:
        return "leftover", f"processes {left} outlived the job"
    return "survived", ""


def campaign(trials: list[Trial], run: Callable[[Trial], tuple[str, str, Counter[str]]], *, jobs: int,
             faults_wanted: int | None, budget_s: float | None) -> Iterator[tuple[Trial, str, str, Counter[str]]]:
    """Run ``trials`` in order, ``jobs`` at a time, and yield each as it ends. No trial starts once ``faults_wanted``
    faults were injected by the trials that ended, or ``budget_s`` seconds have passed; the ones running finish."""
    started, total = time.monotonic(), 0
    pending = iter(trials)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running: dict[Future[tuple[str, str, Counter[str]]], Trial] = {}
        while True:
            enough = (faults_wanted is not None and total >= faults_wanted) or \
                (budget_s is not None and time.monotonic() - started >= budget_s)
            while not enough and len(running) < jobs:
                trial = next(pending, None)
                if trial is None:
                    break
                running[pool.submit(run, trial)] = trial
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: running[f].number):
                trial = running.pop(future)
                verdict, detail, hit = future.result()
                total += sum(hit.values())
                yield trial, verdict, detail, hit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=len(KINDS) * 4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mtbf", help="trials of many faults each: the simulator draws them (slurmrt sim --mtbf) with "
                                  "this mean time between failures of training time, e.g. 3s")
    p.add_argument("--steps", type=int, help=f"training steps of each trial (default {STEPS}; with --mtbf, "
                                             f"{MTBF_STEPS})")
    p.add_argument("--jobs", type=int, default=1, help="trials at once (default 1)")
    p.add_argument("--faults", type=int, help="start no trial once this many faults were injected (with --mtbf, "
                                              "--trials is then a ceiling)")
    p.add_argument("--budget", type=float, help="start no trial after this many seconds")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one trial may take")
    p.add_argument("--keep", action="store_true", help="keep the trials' directories")
    p.add_argument("--only", type=int, action="append", help="run only this trial of the campaign (repeatable)")
    args = p.parse_args(argv)
    for name in ("trials", "jobs", "faults", "budget", "timeout"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name} must be positive, not {getattr(args, name)}")
    steps = args.steps or (MTBF_STEPS if args.mtbf else STEPS)
    work = Path(tempfile.mkdtemp(prefix="slurmrt-chaos-"))
    started = time.monotonic()
    faults: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    ran = quiet = moments = 0
    phases: Counter[str] = Counter()
    try:
        expected = reference(work, steps)
        trials = [t for t in draw(args.seed, args.trials, args.mtbf) if not args.only or t.number in args.only]
        for trial, verdict, detail, hit in campaign(
                trials, lambda t: judge(t, work, expected, args.timeout, steps), jobs=args.jobs,
                faults_wanted=args.faults, budget_s=args.budget):
            ran += 1
            quiet += not hit  # a trial that met no fault tests nothing: said apart, not counted as survived
            where, apart = _met(trial, work, hit)
            phases, moments = phases + where, moments + apart
            for kind, n in hit.items():
                faults[(kind, verdict)] += n
            said = ", ".join(f"{n} {k}" for k, n in hit.items()) if trial.mtbf else \
                f"step {trial.step}, at {trial.at_s:.2f} s, target {trial.target}"
            print(f"trial {trial.number} {trial.kind} ({said or 'no fault'}): {verdict}", flush=True)
            if verdict != "survived":
                failures.append(f"seed {args.seed} trial {trial.number} {trial.kind}: {verdict}: {detail}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    command = "python -m benchmarks.chaos " + " ".join(
        f"--{name} {getattr(args, name)}" for name in ("trials", "seed", "mtbf", "steps", "jobs", "faults", "budget")
        if getattr(args, name) is not None)
    by_phase = ", ".join(f"{phases[p]} {p}" for p in PHASES if phases[p]) or "none"
    return summarize(f"seed {args.seed}, {ran} trials ({quiet} met no fault) in {time.monotonic() - started:.0f} s; "
                     f"{sum(faults.values())} faults in {moments} independent moments, by phase: {by_phase}; "
                     f"command: {command}",
                     faults, failures)


def _met(trial: Trial, work: Path, hit: Counter[str]) -> Met:
    """A trial's faults by phase and its independent moments: a fault the worker makes at a step (a rank killed or
    hung, every rank dying) lands in training, one moment; the simulator's, as its list and the event log say."""
    if trial.mtbf is None and trial.kind in ("rank-killed", "rank-hung", "all-ranks-die"):
        return Counter({"training": sum(hit.values())}), int(bool(hit))
    return read_met(work / f"trial-{trial.number:04d}-{trial.kind}")


def summarize(said: str, faults: Counter[tuple[str, str]], failures: list[str],
              kinds: tuple[str, ...] = KINDS + SIM_KINDS) -> int:
    """Print a campaign's end: the machine and ``said``, the table, each failure; 1 when a trial failed."""
    print(f"\n{machine()}; {said}\n")
    print(report(faults, kinds))
    for failure in failures:
        print(f"\n{failure}")
    return 1 if failures else 0


def report(faults: Counter[tuple[str, str]], kinds: tuple[str, ...] = KINDS + SIM_KINDS) -> str:
    """The campaign's table: faults by kind, and in which trials they ended."""
    found = sorted({k for k, _ in faults}, key=lambda k: (k not in kinds, kinds.index(k) if k in kinds else 0, k))
    rows = [[kind, sum(n for (k, _), n in faults.items() if k == kind)] +
            [faults[(kind, v)] for v in VERDICTS] for kind in found]
    rows.append(["all", sum(faults.values())] + [sum(n for (_, v), n in faults.items() if v == verdict)
                                                 for verdict in VERDICTS])
    return table(["fault", "injected", *(f"in {v} trials" if v != "survived" else v for v in VERDICTS)], rows)


if __name__ == "__main__":
    sys.exit(main())
