"""13b. Goodput under failures on the test cluster: :mod:`benchmarks.bench_goodput`'s four policies, a shorter trace.

The same training and the same four policies (their batch scripts, ``bench_goodput._script``), as real sbatch jobs on
the 4-node test cluster (``tests/slurm/cluster.sh start`` first): policy 1 on two nodes, ``--requeue``; policies 2-4
on three, ``--no-kill``, under ``slurmrt run --spare-nodes 1``. One seeded trace (``slurmrt.sim.faults.draw``, the
first ``FAULTS`` faults: node loss, rank crash, hang, preemption) is replayed into each policy's job on its training
clock, as ``slurmrt sim --after-checkpoint`` counts it: the seconds during which the job has training processes and
has committed a checkpoint since the fault before. Each fault comes from outside, as the cluster campaign injects
it (:class:`benchmarks.chaos_cluster.Trial`): SIGKILL or SIGSTOP of a training process, a node set down and drained
(back in service once the job has saved again), a preemptor job in the ``high`` partition. Policy 4 starts from
slurmrt's default prior, as in the simulator's series. Each job is read by ``slurmrt.record.goodput``, with its faults
answered in the job counted against those it could answer; the final weights of the four must be those of an
uninterrupted run, bit for bit.

    tests/slurm/cluster.sh start
    python -m benchmarks.run goodput_cluster
    python -m benchmarks.bench_goodput_cluster --keep /tmp/gc-keep   # the jobs' event logs kept, to read after
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import Section, table
from .bench_goodput import ENV, EVERY, LOCAL_EVERY, NODES, POLICIES, STATE_MB, STEP_TIME, Policy, _script, _weights

FAULTS = 8


def _submit(directory: Path, policy: Policy, steps: int) -> Any:
    from tests.slurm.conftest import submit

    body = _script(directory, policy, steps).read_text().split("\n", 1)[1]
    # policy 4 learns the failure rate from slurmrt's default prior, as a user's job would (no oracle)
    exports = {**ENV, "SLURMRT_NODE_LEDGER": str(directory / "ledger.json")}
    nodes = ("-N3", "--no-kill") if policy.spare else (f"-N{NODES}",)
    return submit(directory, body, *nodes, "--ntasks-per-node=1", "--requeue", "--signal=USR1@10",
                  exports=exports, name=f"goodput-{policy.name[0]}")


def _replay(directory: Path, job: Any, faults: list[Any], timeout_s: float) -> list[tuple[str, bool]]:
    """Inject ``faults`` into ``job`` on its training clock; returns what was injected, in order, each with whether
    the job could answer it itself (all but a preemption and the loss of the batch script's node)."""
    from tests.slurm.conftest import slurm

    from .chaos_cluster import Trial, newest_save, processes, settled

    trial = Trial(0, directory, job, random.Random(0))
    clock, since, done = 0.0, 0.0, []
    pending = list(faults)
    deadline, last = time.monotonic() + timeout_s, time.monotonic()
    try:
        while not settled(job):  # a job ended by its batch node's loss waits for its guard job's requeue
            assert time.monotonic() < deadline, f"job {job.id} did not end within {timeout_s:.0f} s"
            time.sleep(0.2)
            now = time.monotonic()
            saved = newest_save(directory, job)
            running = saved is not None and saved[0] > since and bool(processes(job.id))
            if saved is not None and saved[0] > since or "ReqNodeNotAvail" in (job.info() or [{}])[0].get("Reason", ""):
                trial.restore()  # saved since the last fault, or cannot start without it: a lost node serves again
            clock += (now - last) if running else 0.0
            last = now
            if pending and running and clock >= pending[0].at_s and job.state() == "RUNNING":
                fault = pending.pop(0)
                could = _could_answer(job, fault, processes(job.id))
                if trial.inject(fault.kind, fault.target, 0):
                    done.append((fault.kind, could))
                    since = time.time()
                else:
                    pending.insert(0, fault)
        return done
    finally:
        trial.restore()
        for other in trial.others:
            slurm("scancel", other.id, check=False)


def _could_answer(job: Any, fault: Any, live: list[tuple[int, str]]) -> bool:
    """Whether the job could answer ``fault`` itself: not a preemption, nor the loss of its batch script's node (the
    node :class:`~benchmarks.chaos_cluster.Trial` will take: the target's process's)."""
    if fault.kind == "preemption":
        return False
    if fault.kind != "node-loss" or not live:
        return True
    return live[fault.target % len(live)][1] != (job.info() or [{}])[0].get("BatchHost")


def _policy(work: Path, policy: Policy, faults: list[Any], steps: int) -> dict[str, Any]:
    from slurmrt.record.events import read_events
    from slurmrt.record.goodput import account

    directory = work / f"policy{policy.name[0]}"
    directory.mkdir()
    job = _submit(directory, policy, steps)
    injected = _replay(directory, job, faults, timeout_s=1800)
    info = job.wait(120)
    shutil.rmtree(f"/dev/shm/{directory.name}-local", ignore_errors=True)
    if info.get("JobState") != "COMPLETED":
        raise RuntimeError(f"policy {policy.name}: job {job.id} ended {info.get('JobState')}:\n{job.output()[-4000:]}")
    (log,) = (directory / "ckpt").glob("events-*.jsonl")
    events = list(read_events(log))
    return {"ledger": account(events), "injected": injected, "weights": _weights(directory),
            "restarts": int(info.get("Restarts", 0)), "events": events}


def _uninterrupted(work: Path, steps: int) -> list[float]:
    directory = work / "uninterrupted"
    directory.mkdir()
    job = _submit(directory, POLICIES[0], steps)
    info = job.wait(1200)
    if info.get("JobState") != "COMPLETED":
        raise RuntimeError(f"the uninterrupted job ended {info.get('JobState')}:\n{job.output()[-3000:]}")
    return _weights(directory)


def run(quick: bool = False, keep: Path | None = None) -> Section:
    """The four policies' jobs under one trace; ``keep``: a new directory (on a path every node of the cluster
    sees) that keeps each job's directory, its event log and output (``slurmrt status DIR/policyK/ckpt``)."""
    from slurmrt.record.goodput import CATEGORIES
    from slurmrt.sim.faults import draw
    from tests.slurm.conftest import CONF

    os.environ.setdefault("SLURM_CONF", str(CONF))
    mtbf_s, seed = 8.0, 43
    steps = 400 if quick else 1200
    faults = draw(mtbf_s, seed, horizon_s=mtbf_s * 400)[:3 if quick else FAULTS]
    if keep is not None:
        keep.mkdir(parents=True)  # a new directory: an earlier run's logs are never mixed in
    work = keep or Path(tempfile.mkdtemp(prefix="slurmrt-goodput-cluster-"))  # every test cluster node sees /tmp
    try:
        expected = _uninterrupted(work, steps)
        results = {p.name: _policy(work, p, faults, steps) for p in POLICIES}
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, r in results.items():
        ledger = r["ledger"]
        injected = [kind for kind, _ in r["injected"]]
        kinds = ", ".join(f"{injected.count(k)} {k}" for k in dict.fromkeys(injected))
        could = sum(c for _, c in r["injected"])
        answered = sum(e["event"] == "in_job_restart" for e in r["events"])
        rows.append([name, kinds or "none", r["restarts"], f"{answered}/{could}", f"{ledger.wall_s:.0f}",
                     f"**{ledger.ettr:.1%}**",
                     f"{ledger.node_goodput:.1%}" if ledger.node_goodput is not None else "-",
                     *[f"{ledger.seconds[c] / ledger.wall_s:.1%}" for c in CATEGORIES[1:]]])
    same = all(r["weights"] == expected for r in results.values())
    trace = ", ".join(f"{f.at_s:.1f} s {f.kind}" for f in faults)
    body = (f"{steps} steps of {STEP_TIME} s, {NODES} training nodes, {STATE_MB} MiB per rank, shared saves every "
            f"{EVERY} steps (local every {LOCAL_EVERY} in policy 3; `should_save` in 4), on the 4-node test cluster. "
            f"The trace (seed {seed}, mean {mtbf_s:g} s between failures, training clock): {trace}.\n\n"
            + table(["policy", "faults injected", "requeues", "answered in the job", "wall s", "ETTR", "node-hours",
                     *CATEGORIES[1:]], rows)
            + "\n\nAnswered in the job: the in-job restarts of the job's event log, against the faults it could "
              "answer (all but a preemption and the loss of the batch script's node). Policy 4 starts from "
              "slurmrt's default prior and learns the rate from the job's own failures."
            + f"\n\nFinal weights of the four jobs against an uninterrupted job: "
              f"{'bitwise equal' if same else 'DIFFERENT'}.")
    return Section("Goodput under failures on the test cluster: four policies, one shorter trace", body)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_goodput_cluster",
                                     description="Goodput under failures on the test cluster (tests/slurm/cluster.sh "
                                     "start first): prints a markdown section for benchmarks/RESULTS.md.")
    parser.add_argument("--quick", action="store_true", help="400 steps, 3 faults")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="a new directory that keeps every job's event log "
                        "and output (on a path every node sees)")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists():
        parser.error(f"--keep {args.keep}: it exists already; name a new directory")
    print(run(args.quick, args.keep).body)


if __name__ == "__main__":
    main()
