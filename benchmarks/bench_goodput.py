"""13. Goodput under failures: one seeded fault trace, four recovery policies, the same training (issue 41).

The training: ``tests/integration/worker.py``, two training nodes of one rank each (gloo), 0.05 s steps, a
background save of 32 MiB per rank. The faults: ``slurmrt.sim.faults.draw`` from a seed, a compressed mean time
between failures on the job's clock (its runs' time, summed), kinds weighted as the simulator's default (node loss
4, rank crash 3, hang 2, preemption 1), on any node (a --no-kill job that loses its first node, the batch
script's, is requeued by the guard job of ``slurmrt run``), replayed by ``slurmrt sim --trace`` into each policy's
job. The
same trace for every policy: a policy that takes longer meets more of it, as a job under a constant failure rate does. A
requeued job waits ``REQUEUE_WAIT_S`` before its next run (Slurm holds it for its credential lifetime, 120 s by
default, then it queues; here compressed with the rest).

1. requeue only, a shared save every ``EVERY`` steps (the batch script requeues on a failure);
2. in-job restart on one spare node (``slurmrt run --spare-nodes 1``, ``--no-kill``), shared saves as in 1;
3. in-job, and the local tier (``/dev/shm``, replicated to a partner node) every ``LOCAL_EVERY`` steps;
4. in-job, the local tier, and ``rt.should_save``: Daly's intervals for each tier, from the measured stalls and a
   prior equal to the trace's true failure rate, learned from the job's history after that.

Each policy's job is read by ``slurmrt.record.goodput``: ETTR, node-hour goodput and every badput category. Then a
model at 1,024 and 16,384 GPUs (:func:`model`) takes the per-event costs measured here and on the test cluster and
Llama 3's interruption rate, and says what each policy would keep.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ._common import ROOT, Section, table

WORKER = ROOT / "tests" / "integration" / "worker.py"
NODES = 2
STEP_TIME = 0.05
EVERY, LOCAL_EVERY = 100, 20
STATE_MB = 32
REQUEUE_WAIT_S = 2.0
#: The fault trace: a seed and the mean time between failures on the job's clock (``--quick``: its own).
MTBF_S, SEED = 8.0, 41
ENV = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", "SLURMRT_STARTUP_TIMEOUT_S": "30",
       "SLURMRT_PROGRESS_S": "1", "OMP_NUM_THREADS": "1", "SLURMRT_MAX_FUTILE_RUNS": "none"}


@dataclass(frozen=True)
class Policy:
    name: str
    spare: bool
    local: bool
    auto: bool


POLICIES = (Policy("1 requeue only, fixed interval", False, False, False),
            Policy("2 in-job + spare, shared tier, fixed", True, False, False),
            Policy("3 in-job + local tier, fixed", True, True, False),
            Policy("4 in-job + local tier + should_save", True, True, True))


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


def _run(work: Path, policy: Policy, trace: Path, steps: int, mtbf_s: float) -> dict[str, Any]:
    """One policy's job under the trace: its ledger, the faults it met, its final weights."""
    from slurmrt.record.events import read_events
    from slurmrt.record.goodput import account

    directory = work / f"policy{policy.name[0]}"
    directory.mkdir()
    nodes = NODES + (1 if policy.spare else 0)
    args = ["-N", str(nodes), "--ntasks-per-node", "1", "--trace", str(trace), "--requeue-wait",
            str(REQUEUE_WAIT_S), *(["--no-kill"] if policy.spare else []), str(_script(directory, policy, steps))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    # The prior of policy 4: the trace's true rate, per node (a site knows its nodes' failure rate roughly).
    env.update(ENV, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(directory),
               SLURMRT_MTBF_NODE_H=f"{mtbf_s * NODES / 3600:.6f}")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], capture_output=True, text=True, env=env,
                         cwd=directory, timeout=3600)
    shutil.rmtree(f"/dev/shm/{directory.name}-local", ignore_errors=True)
    (directory / "sim.out").write_text(out.stdout + out.stderr)  # what the simulator and slurmrt run said (--keep)
    if out.returncode != 0:
        raise RuntimeError(f"policy {policy.name}: the job did not finish:\n{out.stdout[-4000:]}\n{out.stderr[-3000:]}")
    (log,) = (directory / "ckpt").glob("events-*.jsonl")
    ledger = account(read_events(log))
    said = next(line for line in out.stdout.splitlines() if line.startswith("faults ("))
    return {"ledger": ledger, "faults": said.split(": ", 1)[1], "seconds": time.monotonic() - started,
            "weights": _weights(directory), "events": list(read_events(log))}


def _weights(directory: Path) -> list[float]:
    import json

    outs = list(directory.glob("out*/rank0.json"))
    last = max(outs, key=lambda p: p.stat().st_mtime_ns)
    return list(json.loads(last.read_text())["w"])


def _saves(result: dict[str, Any]) -> int:
    """The checkpoints (both tiers) rank 0 recorded in one policy's job."""
    return sum(1 for e in result["events"] if e["event"] == "save" and e.get("rank", 0) == 0)


# -- the model at scale ----------------------------------------------------------------------------------------------

#: Llama 3 (Meta, 2024): 466 interruptions in 54 days on 16,384 H100s, one every 2.8 hours; per node of 8 GPUs,
#: one in 2,048 x 2.78 h = 5,700 node-hours. A job of N GPUs fails N / 16,384 times as often.
LLAMA3_JOB_MTBF_H_16K = 54 * 24 / 466


@dataclass(frozen=True)
class Scale:
    gpus: int
    #: spare nodes held by policies 2-4: about 1 % of the nodes (2 of 128, 16 of 2,048)
    spares: int = 0
    #: checkpoint bytes per GPU (weights, optimizer state): 405e9 parameters x 14 bytes over 16,384 GPUs = 0.35 GB;
    #: a model sized to 1,024 GPUs holds about as much per GPU
    gb_per_gpu: float = 0.35


#: The model's inputs: what was measured, and the assumed rates at scale (said in RESULTS.md).
INPUTS = {
    # measured on the test cluster (RESULTS.md, "Recovery: in the job against a requeue"): fault to resumed
    # training, the load apart (a small state), with the hang floor at 5 s; a hang at scale keeps that floor's
    # order when hang_floor_s is set near the step time (the default 180 s is a safe start)
    "detect_s": 5.5, "injob_restart_s": 3.0, "requeue_restart_s": 3.0,
    # Slurm holds a requeued job for its credential lifetime (120 s by default), then it queues: assumed 5 min
    "requeue_wait_s": 120.0 + 180.0,
    # assumed: a parallel filesystem giving 1 GB/s per node to a job's reads (and writes) at once, a node-local
    # tier (/dev/shm, NVMe) 10 GB/s, and host staging for background saves at 25 GB/s (PCIe Gen5, pinned)
    "shared_gbps_per_node": 1.0, "local_gbps_per_node": 10.0, "staging_gbps_per_node": 25.0,
    # assumed: the local tier serves 90 % of failures (a lost node whose partner lives, a crashed or hung rank);
    # the rest (a rack, a switch, the batch node) need the shared tier
    "local_share": 0.9,
    # Llama 3's interruption rate, times this (the sensitivity table varies it)
    "failure_rate_factor": 1.0,
    # the fixed intervals of policies 1-3: a shared save every 30 minutes, a local one every 5
    "fixed_shared_s": 1800.0, "fixed_local_s": 300.0,
    # assumed: the share of failures that lose a node (Llama 3: most interruptions were hardware); a lost node that
    # is the job's first ends a --no-kill job (docs/slurm.md), which its guard job requeues: one in N of them go
    # through a requeue anyway
    "node_loss_share": 0.6,
}


def requeued_share(scale: Scale, policy: Policy, inputs: dict[str, float]) -> float:
    """The share of failures a policy answers with the requeue: all of them without a spare; with S spares, one
    in S + 1 (the spares are used up, and the requeue's new allocation brings S more), and the losses of the first
    node (--no-kill cannot keep the job then: the guard job requeues it)."""
    if not policy.spare:
        return 1.0
    nodes = scale.gpus // 8
    first_node = inputs["node_loss_share"] / nodes
    return first_node + (1.0 - first_node) / (scale.spares + 1)


def model(scale: Scale, policy: Policy, inputs: dict[str, float] = INPUTS) -> dict[str, float]:
    """The expected share of the wall time each policy keeps, first order in the failure rate: per failure, the
    work since the newest usable checkpoint (half an interval) and the recovery; per save, its stall."""
    from slurmrt.checkpoint.cadence import daly

    mtbf = LLAMA3_JOB_MTBF_H_16K * 3600 * 16_384 / scale.gpus / inputs["failure_rate_factor"]
    node_gb = scale.gb_per_gpu * 8
    stall_shared = node_gb / inputs["staging_gbps_per_node"]  # background saves: training waits for the staging
    stall_local = node_gb / inputs["local_gbps_per_node"]  # the local tier's save blocks (memory and a partner)
    load_shared = node_gb / inputs["shared_gbps_per_node"]
    load_local = node_gb / inputs["local_gbps_per_node"]
    requeued = requeued_share(scale, policy, inputs)
    restart = (1.0 - requeued) * inputs["injob_restart_s"] + \
        requeued * (inputs["requeue_restart_s"] + inputs["requeue_wait_s"])
    q = 1.0 - inputs["local_share"] if policy.local else 1.0  # failures the shared tier must serve
    if policy.auto and policy.local:
        t_shared = daly(stall_shared, mtbf / q)
        t_local = daly(stall_local, mtbf / (1 - q)) if q < 1 else math.inf  # a local tier that serves none: unused
    elif policy.auto:  # one tier: Young/Daly for its own save cost, every failure served by it
        t_shared, t_local = daly(stall_shared, mtbf), math.nan
    else:
        t_shared, t_local = inputs["fixed_shared_s"], inputs["fixed_local_s"]
    stall = stall_shared / t_shared + (stall_local / t_local if policy.local else 0.0)
    local = policy.local and q < 1  # failures the local tier serves
    lost = q * t_shared / 2 + ((1 - q) * t_local / 2 if local else 0.0)
    load = q * load_shared + ((1 - q) * load_local if local else 0.0)
    per_failure = inputs["detect_s"] + restart + load + lost
    ettr = max(0.0, 1.0 - stall - per_failure / mtbf)
    nodes = scale.gpus // 8
    held = nodes + (scale.spares if policy.spare else 0)
    return {"ettr": ettr, "node_goodput": ettr * nodes / held, "requeued": requeued, "mtbf_h": mtbf / 3600,
            "per_failure_s": per_failure, "stall": stall, "t_shared_s": t_shared,
            "t_local_s": t_local if policy.local else math.nan}


#: Policy 1 with the interval Young/Daly give for its own save cost: the row that shows what in-job recovery adds
#: beyond a better interval (a model row only: the measured part keeps the four policies).
BASELINE = Policy("1* requeue only, Young/Daly interval", False, False, True)
MODEL_POLICIES = (POLICIES[0], BASELINE, *POLICIES[1:])


def _model_table() -> str:
    rows = []
    for scale in SCALES:
        for policy in MODEL_POLICIES:
            m = model(scale, policy)
            local = "-" if math.isnan(m["t_local_s"]) else f"{m['t_local_s']:.0f}"
            rows.append([f"{scale.gpus:,}", policy.name, f"{m['mtbf_h']:.1f}", scale.spares if policy.spare else 0,
                         f"{m['requeued']:.0%}", f"{m['t_shared_s']:.0f}", local, f"{m['stall']:.2%}",
                         f"{m['per_failure_s']:.0f}", f"**{m['ettr']:.1%}**", f"{m['node_goodput']:.1%}"])
    return table(["GPUs", "policy", "job MTBF h", "spares", "failures requeued", "shared every s", "local every s",
                  "save stall", "cost per failure s", "ETTR", "node-hours"], rows)


def run(quick: bool = False) -> Section:
    from slurmrt.sim.faults import draw, write_trace

    mtbf_s, seed = (6.0, 1) if quick else (MTBF_S, SEED)
    steps = 400 if quick else 2800
    work = Path(tempfile.mkdtemp(prefix="slurmrt-goodput-"))
    try:
        trace = work / "trace.csv"
        faults = draw(mtbf_s, seed, horizon_s=mtbf_s * 400)
        write_trace(trace, faults)
        results = {p.name: _run(work, p, trace, steps, mtbf_s) for p in POLICIES}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Section("Goodput under failures: four policies, one fault trace", _body(results, mtbf_s, seed, steps))


def _body(results: dict[str, dict[str, Any]], mtbf_s: float, seed: int, steps: int) -> str:
    from slurmrt.record.goodput import CATEGORIES

    rows = []
    for name, r in results.items():
        ledger = r["ledger"]
        rows.append([name, r["faults"], f"{ledger.wall_s:.0f}", f"**{ledger.ettr:.1%}**",
                     f"{ledger.node_goodput:.1%}" if ledger.node_goodput is not None else "-",
                     *[f"{ledger.seconds[c] / ledger.wall_s:.1%}" for c in CATEGORIES[1:]], _saves(r)])
    first, last = (results[p.name]["ledger"].ettr or 0.0 for p in (POLICIES[0], POLICIES[-1]))
    weights = {tuple(r["weights"]) for r in results.values()}
    measured = table(["policy", "faults met", "wall s", "ETTR", "node-hours", *CATEGORIES[1:], "saves"], rows)
    return (f"**(a) Measured under `slurmrt sim`**: {steps} steps of {STEP_TIME} s, {NODES} training nodes, "
            f"{STATE_MB} MiB per rank, the trace of seed {seed} at a mean of {mtbf_s:g} s between failures, a "
            f"requeue waiting {REQUEUE_WAIT_S:g} s.\n\n{measured}\n\nPolicy 4 against policy 1: "
            f"{(last - first) * 100:+.1f} ETTR points. Final weights of the four jobs: "
            f"{'bitwise equal' if len(weights) == 1 else 'DIFFERENT'}.\n\n(b) {model_section()}")


SCALES = (Scale(1024, spares=2), Scale(16_384, spares=16))

#: What the 16,384-GPU figures become when an assumption is off: each row changes the inputs named.
SENSITIVITY = {"a hang found after the default 180 s floor": {"detect_s": 180.0},
               "every restart (in the job, or a requeued run's start) takes 1 minute": {"injob_restart_s": 60.0,
                                                                                        "requeue_restart_s": 60.0},
               "every restart takes 5 minutes (NCCL set-up, a model build)": {"injob_restart_s": 300.0,
                                                                              "requeue_restart_s": 300.0},
               "every restart takes 10 minutes": {"injob_restart_s": 600.0, "requeue_restart_s": 600.0},
               "the local tier serves half the failures": {"local_share": 0.5},
               "the local tier serves none": {"local_share": 0.0},
               "a slow shared filesystem (0.2 GB/s per node), staging no faster": {"shared_gbps_per_node": 0.2,
                                                                                  "staging_gbps_per_node": 0.2},
               "the queue after a requeue takes 30 minutes": {"requeue_wait_s": 1920.0},
               "the queue after a requeue takes 1 minute": {"requeue_wait_s": 60.0},
               "failures 4x as frequent": {"failure_rate_factor": 4.0},
               "failures 4x as rare": {"failure_rate_factor": 0.25},
               "one spare node, not 16": {"spares": 1.0}}


def sensitivity_rows() -> list[tuple[str, dict[str, float]]]:
    """Each row of the sensitivity table: what changes, and each model policy's ETTR at 16,384 GPUs."""
    rows = []
    for what, change in {"as above": {}, **SENSITIVITY}.items():
        scale = replace(SCALES[-1], spares=int(change.get("spares", SCALES[-1].spares)))
        rows.append((what, {p.name: model(scale, p, {**INPUTS, **change})["ettr"] for p in MODEL_POLICIES}))
    return rows


def _sensitivity() -> str:
    rows = sensitivity_rows()
    first, better, last = POLICIES[0].name, BASELINE.name, POLICIES[-1].name
    body = [[what, *(f"{e[p.name]:.1%}" for p in MODEL_POLICIES), f"{(e[last] - e[better]) * 100:+.1f}"]
            for what, e in rows]
    header = ["at 16,384 GPUs, if", *(p.name.split(" ", 1)[0] for p in MODEL_POLICIES), "4 - 1* (points)"]
    gains = {what: (e[last] - e[better]) * 100 for what, e in rows}
    over_first = [(e[last] - e[first]) * 100 for _, e in rows]
    below = [what for what, gain in gains.items() if gain <= 0]
    said = (f"Over every row, policy 4 keeps {min(over_first):+.1f} to {max(over_first):+.1f} points over policy 1, "
            f"and {min(gains.values()):+.1f} to {max(gains.values()):+.1f} over policy 1 with a Young/Daly interval "
            "(1*): " + ("policy 4 stays above 1* in every row, so what it adds beyond a better interval is the "
                        "claim that survives." if not below else
                        "policy 4 is not above 1* where " + "; ".join(f'"{w}"' for w in below) + "."))
    table_of = dict(rows)
    if table_of["the local tier serves none"][last] >= table_of["as above"][last]:
        said += (" The local tier does not pay in this model: policy 4 keeps more when it serves no failure (a "
                 f"blocking local save at {INPUTS['local_gbps_per_node']:g} GB/s per node stalls longer than a "
                 f"background shared save staged at {INPUTS['staging_gbps_per_node']:g} GB/s): its gain over 1* "
                 "comes from the in-job restart.")
    return table(header, body) + "\n\n" + said


#: Where each input of the model comes from: measured (where, at what scale) or assumed (on what grounds).
SOURCES = {
    "detect_s": "measured on the test cluster, 2 CPU ranks: a hang found at a 5 s floor (section Recovery)",
    "injob_restart_s": "measured on the test cluster, 2 CPU ranks, a small state: init to resumed training took "
                       "2.3-2.8 s (section Recovery)",
    "requeue_restart_s": "measured as the in-job restart (the same start-up); a large job's NCCL set-up and model "
                         "build take longer: the sensitivity rows of 1, 5 and 10 minutes",
    "requeue_wait_s": "assumed: Slurm holds a requeued job for its credential lifetime (120 s by default), then "
                      "3 minutes in the queue",
    "shared_gbps_per_node": "assumed: a parallel filesystem shared by the job's nodes",
    "local_gbps_per_node": "assumed: /dev/shm or a node-local NVMe",
    "staging_gbps_per_node": "assumed: PCIe Gen5, pinned host buffers",
    "local_share": "assumed: the failures a partner's replica serves (a lost node whose partner lives, a crash, a "
                   "hang)",
    "failure_rate_factor": "Llama 3's rate (Meta, 2024: 466 interruptions in 54 days on 16,384 GPUs), times this",
    "fixed_shared_s": "the fixed policies' choice", "fixed_local_s": "the fixed policies' choice",
    "node_loss_share": "assumed: the share of failures that lose a node (Llama 3: most were hardware)",
}


def _inputs_said() -> str:
    return "\n\n" + table(["input", "value", "source"], [[k, f"{v:g}", SOURCES[k]] for k, v in INPUTS.items()])


def diagnose(keep: Path, steps: int, policies: list[int]) -> None:
    """The chosen policies' jobs under the same trace, their event logs and the simulator's output kept in
    ``keep/policyK`` (read them with ``slurmrt status``), each one's ETTR printed; no table."""
    from slurmrt.sim.faults import draw, write_trace

    keep.mkdir(parents=True)
    trace = keep / "trace.csv"
    write_trace(trace, draw(MTBF_S, SEED, horizon_s=MTBF_S * 400))
    for k in policies:
        policy = POLICIES[k - 1]
        result = _run(keep, policy, trace, steps, MTBF_S)
        print(f"{policy.name}: {result['faults']}; ETTR {result['ledger'].ettr:.1%}", flush=True)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_goodput", description="Goodput under failures: four recovery policies "
        "measured under `slurmrt sim` on one fault trace (tens of minutes), then a model at 1,024 and 16,384 GPUs "
        "with its sensitivity table. Prints a markdown section for benchmarks/RESULTS.md.")
    parser.add_argument("--quick", action="store_true", help="a short job (400 steps) under a denser trace")
    parser.add_argument("--model", action="store_true", help="the model and its sensitivity table only: no job is "
                        "run (seconds)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="diagnose: run the chosen policies' jobs, keep "
                        "their event logs in DIR/policyK, print each one's ETTR; no table")
    parser.add_argument("--steps", type=int, default=2800, help="with --keep: the job's steps (default 2800)")
    parser.add_argument("--policies", default="1,2,3,4", help="with --keep: which of 1-4, comma-separated")
    args = parser.parse_args(argv)
    if args.keep is not None:
        chosen = args.policies.split(",")
        if not set(chosen) <= {"1", "2", "3", "4"}:
            parser.error(f"--policies {args.policies!r}: name policies 1 to 4, comma-separated (2,3)")
        diagnose(args.keep, args.steps, [int(k) for k in chosen])
    elif args.model:
        print(model_section())
    else:
        print(run(quick=args.quick).body)


def model_section() -> str:
    """Part (b) alone: the model at scale, its inputs and its sensitivity table."""
    return (f"**Modelled at scale**, Llama 3's interruption rate (a job of N GPUs fails N / 16,384 times every "
            f"{LLAMA3_JOB_MTBF_H_16K:.1f} h):\n\n{_model_table()}\n\nInputs:{_inputs_said()}\n\n{_sensitivity()}")


if __name__ == "__main__":
    main()
