"""13. Goodput under failures: four recovery policies meet the same faults at the same steps of training, over seeds.

The training: ``tests/integration/worker.py``, two training nodes of one rank each (gloo), 0.05 s steps, a
background save of 32 MiB per rank. The faults, per seed: ``slurmrt.sim.faults.draw`` moved to the training clock
(``on_steps``): a mean of ``MTBF_S`` seconds of training between faults, at least ``MIN_GAP`` steps apart, none in
the last tenth of the steps (a fault must land while steps remain), kinds weighted as the simulator's default (node
loss 4, rank crash 3, hang 2, preemption 1), on any node (a --no-kill job that loses its first node, the batch
script's, is requeued by the guard job of ``slurmrt run``). ``slurmrt sim --trace`` injects each one when rank 0
reports that it trains at the fault's step, once the job is back at work after the fault before: every policy meets
the same faults at the same steps, however long its recoveries take. A preemption comes with the job's ``--signal``
(SIGUSR1) at once and SIGTERM after the grace time, as Slurm's ``preempt_send_user_signal`` sends them. A requeued
job waits ``REQUEUE_WAIT_S`` before its next run: the hold the test cluster's real Slurm puts on a requeued job, its
credential's expiry plus 1 s (``cred_expire=10`` there, shortened from Slurm's default of 120 s; docs/slurm.md),
before any time in the queue: the least a real requeue waits.

1. requeue only, a shared save every ``EVERY`` steps (the batch script requeues on a failure);
2. in-job restart on one spare node (``slurmrt run --spare-nodes 1``, ``--no-kill``), shared saves as in 1;
3. in-job, and the local tier (``/dev/shm``, replicated to a partner node) every ``LOCAL_EVERY`` steps;
4. in-job, the local tier, and ``rt.should_save``: Daly's intervals for each tier from the measured stalls and
   slurmrt's default prior, learned from the job's own history after that, as a user's job learns it (no oracle).

Each job is read by ``slurmrt.record.goodput``, and its faults answered in the job counted (:func:`in_job`): the
in-job restarts its event log holds, against the faults injected that were neither a preemption nor the loss of the
batch script's node. Every comparison is over the seeds: each policy's median ETTR and its
range, and the median of the per-seed differences to policy 1 with their range. The model at scale is
:mod:`benchmarks.goodput_model`.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import ROOT, Section, table
from .goodput_model import POLICIES, Policy, model_section

__all__ = ["ENV", "EVERY", "LOCAL_EVERY", "NODES", "POLICIES", "STATE_MB", "STEP_TIME", "Policy", "faults_for",
           "main", "run"]

WORKER = ROOT / "tests" / "integration" / "worker.py"
NODES = 2
STEP_TIME = 0.05
EVERY, LOCAL_EVERY = 100, 20
STATE_MB = 32
REQUEUE_WAIT_S = 11.0
#: The faults: a mean of MTBF_S seconds of training between them (300 steps, three shared saves of policies 1 and
#: 2), at least MIN_GAP steps apart; the seeds FIRST_SEED, FIRST_SEED + 1, ...
MTBF_S, MIN_GAP, FIRST_SEED, SEEDS, STEPS = 15.0, 40, 41, 5, 1200
#: The preemption's warning (``sbatch --signal=USR1@60``: at once on a preemption) and its grace time.
SIGNAL, GRACE_S = "USR1@60", 20.0
ENV = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", "SLURMRT_STARTUP_TIMEOUT_S": "30",
       "SLURMRT_PROGRESS_S": "1", "OMP_NUM_THREADS": "1", "SLURMRT_MAX_FUTILE_RUNS": "none"}


def _script(directory: Path, policy: Policy, steps: int) -> Path:
    every = ["--save-every", "auto"] if policy.auto else \
        ["--save-every", str(EVERY), *(["--local-every", str(LOCAL_EVERY)] if policy.local else [])]
    worker = [sys.executable, str(WORKER), "--out", f"{directory}/out${{SLURM_RESTART_COUNT:-0}}", "--steps",
              str(steps), "--step-time", str(STEP_TIME), "--state-mb", str(STATE_MB), *every]
    command = " ".join(f'"{a}"' if "$" in a else a for a in worker)
    env = f"export SLURMRT_CHECKPOINT_DIR={directory}/ckpt\n"
    if policy.local:  # the node-local directory exists on every node (here, one machine's /dev/shm)
        env += f"export SLURMRT_LOCAL_CHECKPOINT_DIR=/dev/shm/{directory.name}-local\n" \
            f"mkdir -p /dev/shm/{directory.name}-local\n"
    if policy.spare:
        body = f"exec {sys.executable} -m slurmrt run --spare-nodes 1 -- {command}"
    else:  # as users write it: requeue on a failure slurmrt could not answer itself (a killed rank 0)
        body = f"srun --kill-on-bad-exit=1 {command}\nrc=$?\ncase $rc in 0|1|2|3|4|78) ;; *) scontrol requeue " \
               '"$SLURM_JOB_ID" ;; esac\nexit $rc'
    script = directory / "job.sbatch"
    script.write_text(f"#!/bin/bash\n{env}{body}\n")
    return script


def faults_for(seed: int, steps: int, mtbf_s: float = MTBF_S) -> list[Any]:
    """The faults of ``seed`` on the training clock: the same for every policy."""
    from slurmrt.sim.faults import draw, on_steps

    last = int(steps * 0.9)  # the job reports its step every second: a fault at its last steps might never come
    moved = on_steps(draw(mtbf_s, seed, horizon_s=last * STEP_TIME), STEP_TIME, min_gap=MIN_GAP)
    return [f for f in moved if f.at_step is not None and f.at_step <= last]


def _run(work: Path, policy: Policy, trace: Path, steps: int, requeue_wait_s: float = REQUEUE_WAIT_S) -> dict[str, Any]:
    """One policy's job under the trace: its ledger, the faults it met, its final weights."""
    from slurmrt.record.events import read_events
    from slurmrt.record.goodput import account

    directory = work / f"policy{policy.name[0]}"
    directory.mkdir()
    nodes = NODES + (1 if policy.spare else 0)
    args = ["-N", str(nodes), "--ntasks-per-node", "1", "--trace", str(trace), "--requeue-wait",
            str(requeue_wait_s), "--signal", SIGNAL, "--grace", str(GRACE_S),
            *(["--no-kill"] if policy.spare else []), str(_script(directory, policy, steps))]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE", "SLURMRT_"))}
    env.update(ENV, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(directory))
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], capture_output=True, text=True, env=env,
                         cwd=directory, timeout=3600)
    shutil.rmtree(f"/dev/shm/{directory.name}-local", ignore_errors=True)
    (directory / "sim.out").write_text(out.stdout + out.stderr)  # what the simulator and slurmrt run said (--keep)
    if out.returncode != 0:
        raise RuntimeError(f"policy {policy.name}: the job did not finish:\n{out.stdout[-4000:]}\n{out.stderr[-3000:]}")
    (log,) = (directory / "ckpt").glob("events-*.jsonl")
    # A seed whose trace injects nothing (the job met no fault) counts too, with its zero faults.
    said = next((line for line in out.stdout.splitlines() if line.startswith("faults (")), "faults (none): 0 injected")
    events = list(read_events(log))
    return {"ledger": account(events), "faults": said.split(": ", 1)[1], "met": int(said.split(": ")[1].split()[0]),
            "seconds": time.monotonic() - started, "weights": _weights(directory), "events": events,
            "in_job": in_job(out.stdout, events)}


#: A line of the simulator's list of injected faults: ``  2026-11-27T19:40:01.123 node-loss: n2``.
_INJECTED = re.compile(r"^  (\d{4}-\d\d-\d\dT[\d:.]+) ([a-z-]+): (.+)$")


def in_job(sim_out: str, events: list[dict[str, Any]]) -> tuple[int, int]:
    """(faults answered in the job, faults it could answer): every fault the simulator injected but a preemption
    (the cluster wants the job gone: its requeue is the answer) and the loss of the batch script's node (the first of
    its run's nodes: the guard job requeues), against the in-job restarts ``slurmrt run`` recorded."""
    from datetime import datetime

    from slurmrt.record.events import timestamp

    runs = sorted((timestamp(e), e["nodelist"][0]) for e in events
                  if e["event"] == "init" and "attempt" not in e and e.get("nodelist"))
    could = 0
    for line in sim_out.splitlines():
        match = _INJECTED.match(line)
        if match is None or match[2] == "preemption":
            continue
        at = datetime.fromisoformat(match[1]).timestamp()
        batch = next((node for started, node in reversed(runs) if started <= at), None)
        could += not (match[2] == "node-loss" and match[3] == batch)
    return sum(e["event"] == "in_job_restart" for e in events), could


def _weights(directory: Path) -> list[float]:
    import json

    outs = list(directory.glob("out*/rank0.json"))
    last = max(outs, key=lambda p: p.stat().st_mtime_ns)
    return list(json.loads(last.read_text())["w"])


def _saves(result: dict[str, Any]) -> int:
    """The checkpoints (both tiers) rank 0 recorded in one policy's job."""
    return sum(1 for e in result["events"] if e["event"] == "save" and e.get("rank", 0) == 0)


def run(seeds: int = SEEDS, first_seed: int = FIRST_SEED, steps: int = STEPS, mtbf_s: float = MTBF_S, *,
        quick: bool = False, requeue_wait_s: float = REQUEUE_WAIT_S) -> Section:
    """Every policy's job under each seed's faults; a progress line per job on stderr. ``quick``: 400 steps, 2
    seeds (``python -m benchmarks.run --quick goodput``)."""
    from slurmrt.sim.faults import write_trace

    if quick:
        seeds, steps = min(seeds, 2), 400

    results: dict[int, dict[str, dict[str, Any]]] = {}
    drawn: dict[int, int] = {}
    for n, seed in enumerate(range(first_seed, first_seed + seeds), 1):
        faults = faults_for(seed, steps, mtbf_s)
        drawn[seed] = len(faults)
        work = Path(tempfile.mkdtemp(prefix=f"slurmrt-goodput-{seed}-"))
        try:
            write_trace(work / "trace.csv", faults)
            results[seed] = {}
            for policy in POLICIES:
                r = results[seed][policy.name] = _run(work, policy, work / "trace.csv", steps, requeue_wait_s)
                print(f"seed {seed} ({n}/{seeds}), policy {policy.name}: ETTR {r['ledger'].ettr:.1%}, {r['met']} of "
                      f"{len(faults)} faults met, {r['seconds']:.0f} s", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return Section("Goodput under failures: four policies, the same faults, over seeds",
                   _body(results, drawn, steps, mtbf_s, requeue_wait_s))


def _share(jobs: list[dict[str, Any]]) -> str:
    """The faults answered in the job over those it could answer, summed over the seeds."""
    answered, could = (sum(j["in_job"][i] for j in jobs) for i in (0, 1))
    return f"{answered}/{could} ({answered / could:.0%})" if could else f"{answered}/0"


def _median_range(values: list[float], scale: float = 100.0, fmt: str = ".1f") -> str:
    return (f"{statistics.median(values) * scale:{fmt}} ({min(values) * scale:{fmt}} to "
            f"{max(values) * scale:{fmt}})")


def _body(results: dict[int, dict[str, dict[str, Any]]], drawn: dict[int, int], steps: int, mtbf_s: float,
          requeue_wait_s: float = REQUEUE_WAIT_S) -> str:
    from slurmrt.record.goodput import CATEGORIES

    names = [p.name for p in POLICIES]
    ettr = {name: [results[s][name]["ledger"].ettr or 0.0 for s in results] for name in names}
    rows = []
    for name in names:
        jobs = [results[s][name] for s in results]
        shares = [statistics.median(j["ledger"].seconds[c] / j["ledger"].wall_s for j in jobs) for c in CATEGORIES[1:]]
        rows.append([name, f"**{statistics.median(ettr[name]):.1%}**", _median_range(ettr[name]),
                     f"{statistics.median(j['ledger'].node_goodput or 0.0 for j in jobs):.1%}",
                     sum(j["met"] for j in jobs), f"{statistics.median(j['ledger'].wall_s for j in jobs):.0f}",
                     *[f"{share:.1%}" for share in shares], statistics.median(_saves(j) for j in jobs),
                     _share(jobs)])
    per_policy = table(["policy", "median ETTR", "ETTR % median (range)", "node-hours", "faults met", "wall s",
                        *CATEGORIES[1:], "saves", "answered in the job"], rows)
    first = names[0]
    diffs = {name: [results[s][name]["ledger"].ettr - results[s][first]["ledger"].ettr for s in results]
             for name in names[1:]}
    per_seed = table(["seed", "faults drawn", "met by 1/2/3/4", *(f"ETTR {n[0]}" for n in names),
                      *(f"{n[0]} - 1 points" for n in names[1:])],
                     [[s, drawn[s], "/".join(str(results[s][n]["met"]) for n in names),
                       *(f"{results[s][n]['ledger'].ettr:.1%}" for n in names),
                       *(f"{diffs[n][i] * 100:+.1f}" for n in names[1:])] for i, s in enumerate(results)])
    weights = {tuple(results[s][n]["weights"]) for s in results for n in names}
    return (f"**(a) Measured under `slurmrt sim`**: {len(results)} seeds ({', '.join(map(str, results))}), each: "
            f"{steps} steps of {STEP_TIME} s, {NODES} training nodes, {STATE_MB} MiB per rank, faults at a mean of "
            f"{mtbf_s:g} s of training apart (at least {MIN_GAP} steps), injected at the same steps for every "
            f"policy; a requeue waits {requeue_wait_s:g} s; a preemption sends --signal={SIGNAL} and SIGTERM "
            f"{GRACE_S:g} s later.\n\n{per_policy}\n\nPer seed:\n\n{per_seed}\n\n"
            + _conclusion(ettr, diffs, results, drawn)
            + f" Final weights of all {len(results) * len(names)} jobs: "
            f"{'bitwise equal' if len(weights) == 1 else 'DIFFERENT'}.\n\n(b) {model_section()}")


def _conclusion(ettr: dict[str, list[float]], diffs: dict[str, list[float]],
                results: dict[int, dict[str, dict[str, Any]]], drawn: dict[int, int]) -> str:
    """What the medians say, whatever it is."""
    said = [f"Policy {name[0]} against policy 1: median {statistics.median(d) * 100:+.1f} points (range "
            f"{min(d) * 100:+.1f} to {max(d) * 100:+.1f}; above policy 1 in {sum(x > 0 for x in d)} of {len(d)} "
            "seeds)." for name, d in diffs.items()]
    best = max(ettr, key=lambda n: statistics.median(ettr[n]))
    unequal = [s for s in results if len({r["met"] for r in results[s].values()}) > 1]
    said.append(f"By the medians, policy {best[0]} keeps the most of the wall time.")
    said.append("Every policy met the same faults in every seed." if not unequal else
                f"The policies met different numbers of faults in seed(s) {', '.join(map(str, unequal))} (a fault "
                "due after the job's last report never came): compare those seeds with care.")
    missed = sum(drawn[s] * len(results[s]) - sum(r["met"] for r in results[s].values()) for s in results)
    if missed:
        said.append(f"{missed} drawn fault(s) never came, over all jobs.")
    return " ".join(said)


def diagnose(keep: Path, steps: int, policies: list[int], seed: int = FIRST_SEED,
             requeue_wait_s: float = REQUEUE_WAIT_S) -> None:
    """The chosen policies' jobs under one seed's faults, their event logs and the simulator's output kept in
    ``keep/policyK`` (read them with ``slurmrt status``), each one's ETTR printed; no table."""
    from slurmrt.sim.faults import write_trace

    keep.mkdir(parents=True)
    write_trace(keep / "trace.csv", faults_for(seed, steps))
    for k in policies:
        policy = POLICIES[k - 1]
        result = _run(keep, policy, keep / "trace.csv", steps, requeue_wait_s)
        print(f"{policy.name}: {result['faults']}; ETTR {result['ledger'].ettr:.1%}", flush=True)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_goodput", description="Goodput under failures: four recovery policies "
        "measured under `slurmrt sim`, each seed's faults at the same steps of training for every policy (about 13 "
        "minutes a seed at the default size), then a model at 1,024 and 16,384 GPUs with its sensitivity table. "
        "Prints a markdown section for benchmarks/RESULTS.md; a progress line per job on stderr.")
    parser.add_argument("--seeds", type=int, help=f"how many seeds (default {SEEDS}; a claim needs at least 5)")
    parser.add_argument("--seed", type=int, default=FIRST_SEED, help=f"the first seed (default {FIRST_SEED})")
    parser.add_argument("--steps", type=int, help=f"the job's steps (default {STEPS}; --quick 400)")
    parser.add_argument("--mtbf", type=float, default=MTBF_S, metavar="SECS",
                        help=f"the mean seconds of training between faults (default {MTBF_S:g})")
    parser.add_argument("--requeue-wait", type=float, default=REQUEUE_WAIT_S, metavar="SECS",
                        help=f"how long a requeued job waits before its next run (default {REQUEUE_WAIT_S:g}: the hold "
                        "the test cluster's Slurm puts on a requeued job)")
    parser.add_argument("--quick", action="store_true", help="400 steps, 2 seeds unless --seeds says")
    parser.add_argument("--model", action="store_true", help="the model and its sensitivity table only: no job is "
                        "run (seconds)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="diagnose: run the chosen policies' jobs under "
                        "--seed's faults, keep their event logs in DIR/policyK, print each one's ETTR; no table")
    parser.add_argument("--policies", default="1,2,3,4", help="with --keep: which of 1-4, comma-separated")
    args = parser.parse_args(argv)
    steps = args.steps or (400 if args.quick else STEPS)
    seeds = args.seeds or (2 if args.quick else SEEDS)
    if seeds < 1 or steps < 100 or not args.mtbf > 0 or not 0 <= args.requeue_wait < 3600:
        parser.error("--seeds 1 or more, --steps 100 or more, --mtbf above 0, --requeue-wait 0 to 3600")
    if args.keep is not None:
        chosen = args.policies.split(",")
        if not set(chosen) <= {"1", "2", "3", "4"}:
            parser.error(f"--policies {args.policies!r}: name policies 1 to 4, comma-separated (2,3)")
        diagnose(args.keep, steps, [int(k) for k in chosen], args.seed, args.requeue_wait)
    elif args.model:
        print(model_section())
    else:
        print(run(seeds, args.seed, steps, args.mtbf, requeue_wait_s=args.requeue_wait).body)


if __name__ == "__main__":
    main()
