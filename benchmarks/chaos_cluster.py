"""The fault campaign's series on the test cluster (``tests/slurm/cluster.sh``): real sbatch jobs, faults from outside.

Each trial is one requeueable job of two nodes running ``tests/integration/worker.py`` (deterministic gloo
training); every other trial is ``slurmrt run --spare-nodes 1`` on three nodes (``--no-kill``) with a node-local
tier saved every 5 steps and slow shared saves. While the job lives, faults are drawn from a seed, one at a time: the
next comes an exponential pause after the job's current run (or in-job step) has committed a checkpoint of its own,
so every fault meets a job that made progress, whatever the machine's speed. The kinds:

- ``rank-crash``: SIGKILL of one training process;
- ``hang``: SIGSTOP of one training process;
- ``node-loss``: ``scontrol update state=down`` (then drained, so that Slurm does not take it back at once; back in
  service once a later run has saved, rebooted: its slurmd started afresh) of one of the job's nodes;
- ``preemption``: a job of the ``high`` partition on the job's nodes (``PreemptMode=REQUEUE``, a grace time and the
  job's ``--signal=USR1@10``);
- ``signal-storm``: SIGUSR1, SIGUSR2 and SIGTERM ten times each to every training process;
- ``second-job``: another job on the same checkpoint directory, which must be refused while the first lives.

A trial survives when its job ends COMPLETED (or its last run recorded that the training finished, before Slurm
ended the job otherwise: its batch node lost as it tore down) with the weights of an uninterrupted run, bit for bit,
no process of it is left, and every second job was refused; as in the simulator's campaign, no run may resume from
an older checkpoint than the newest committed, nor skip a step or apply one twice (``chaos.continuity``). A
``--no-kill`` job that loses its first node (its batch script's) is ended by Slurm without a requeue (docs/slurm.md):
the guard job that ``slurmrt run`` armed requeues it.

    tests/slurm/cluster.sh start
    python -m benchmarks.chaos_cluster --faults 50 --seed 1 --mtbf 6s
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from slurmrt.record.events import read_events, timestamp
from tests.slurm.conftest import TERMINAL, Job, slurm, submit

from .chaos import continuity, final_weights, finished, from_scratch, summarize

KINDS = ("node-loss", "rank-crash", "hang", "preemption", "signal-storm", "second-job")
WEIGHTS = (3.0, 3.0, 2.0, 1.0, 1.0, 1.0)
STEPS, STEP_TIME = 200, 0.1
EXPORTS = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5"}


def worker(steps: int, extra: str = "") -> str:
    return f"$PY $WORKER --out $OUT --steps {steps} --step-time {STEP_TIME} --save-every 10 {extra}".strip()


def start_job(directory: Path, number: int, steps: int) -> Job:
    exports = {**EXPORTS, "SLURMRT_NODE_LEDGER": str(directory / "ledger.json")}
    if number % 2:  # in the job: a spare node, a node-local tier, slow shared saves
        exports["SLURMRT_LOCAL_CHECKPOINT_DIR"] = str(directory / "local")
        body = f"mkdir -p {directory / 'local'}; exec $PY -m slurmrt run --spare-nodes 1 -- " + \
            worker(steps, "--local-every 5 --slow-save 0.05")
        args: tuple[str, ...] = ("-N3", "--no-kill")
    else:
        body = "\n".join([f"srun --kill-on-bad-exit=1 --wait=60 {worker(steps)}", "rc=$?",
                          'case $rc in 0|1|2|3|4|78) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', "exit $rc"])
        args = ("-N2",)
    return submit(directory, body, *args, "--ntasks-per-node=1", "--requeue", "--signal=USR1@10",
                  exports=exports, name=f"chaos-{number}")


def processes(job_id: str) -> list[tuple[int, str]]:
    """(pid, node) of the job's training processes on this one-host cluster (their environment says so)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if env.get(b"SLURM_JOB_ID") == job_id.encode() and len(argv) > 1 and argv[1].endswith(b"worker.py"):
            found.append((int(entry.name), env.get(b"SLURMD_NODENAME", b"?").decode()))
    return sorted(found)


def newest_save(directory: Path, job: Job) -> tuple[float, int, int] | None:
    """(time, restart, attempt) of the job's newest committed save, from its event log."""
    path = directory / "ckpt" / f"events-{job.id}.jsonl"
    saves = [(timestamp(e), int(e.get("restart", 0)), int(e.get("attempt", 0)))
             for e in (read_events(path) if path.exists() else []) if e.get("event") == "save"]
    return max(saves, default=None)


@dataclass
class Trial:
    number: int
    directory: Path
    job: Job
    rng: random.Random
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    others: list[Job] = field(default_factory=list)  #: preemptors and second jobs, cancelled at the end

    def inject(self, kind: str, target: int, steps: int) -> bool:
        """Fault ``kind`` into the job's current run; False when no training process was there to hit."""
        live = processes(self.job.id)
        if not live:
            return False
        pid, node = live[target % len(live)]
        if kind == "rank-crash":
            os.kill(pid, signal.SIGKILL)
        elif kind == "hang":
            os.kill(pid, signal.SIGSTOP)
        elif kind == "signal-storm":
            for _ in range(10):
                for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
                    for p, _node in live:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p, sig)
        elif kind == "node-loss":
            slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=slurmrt-chaos")
            slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=slurmrt-chaos")
            self.drained.append(node)
        elif kind == "preemption":
            nodes = self.job.info()[0].get("NodeList", "")
            count = len(slurm("scontrol", "show", "hostnames", nodes).split())
            self.others.append(submit(self.directory / f"high-{len(self.others)}", "sleep 5", "-p", "high",
                                      "--exclusive", f"-N{count}", f"-w{nodes}", name="chaos-high"))
        else:
            return self.second_job(steps)
        return True

    def second_job(self, steps: int) -> bool:
        """Another job on this one's checkpoint directory: refused while this one lives (its lease)."""
        intruder = submit(self.directory / f"intruder-{len(self.others)}", worker(steps), "-N1", name="chaos-2nd",
                          exports={"SLURMRT_CHECKPOINT_DIR": str(self.directory / "ckpt")})
        self.others.append(intruder)
        info = intruder.wait(300)
        out = intruder.output()
        if info.get("JobState") != "COMPLETED" and f"in use by job {self.job.id}" in out:
            return True
        if self.job.state() in TERMINAL:
            return False  # the first job had ended: the directory was free
        self.problems.append(f"second job {intruder.id}: {info.get('JobState')}, not refused: {out[-1500:]}")
        return True

    def restore(self) -> None:
        for node in self.drained:
            reboot(node)
            for state in ("resume", "idle"):
                slurm("scontrol", "update", f"nodename={node}", f"state={state}", check=False)
        self.drained.clear()


def reboot(node: str) -> None:
    """Start the node's slurmd afresh, as a failed node comes back from a reboot. Set down and resumed with its slurmd
    still running, a node keeps the job it ran in mind: when the requeued job lands on it again, its slurmd refuses
    ("Job 915 already running, do not launch second copy"), Slurm drains the node ("Duplicate jobid") and holds
    the job ("launch failed requeued held") until someone releases it (seen in the goodput benchmark, 2026-11-26)."""
    from tests.slurm.conftest import CLUSTER_DIR, CONF

    pidfile = CLUSTER_DIR / f"slurmd-{node}.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text())
        if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":  # only the daemon the test cluster started
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)
    subprocess.run(["slurmd", "-N", node, "-c", "-f", str(CONF)], check=False, capture_output=True, timeout=60)


def settled(job: Job) -> bool:
    """The job ended, and no guard job of it (``slurmrt run``'s, which may requeue it) is queued or running."""
    if job.state() not in TERMINAL:
        return False
    return not slurm("squeue", "-h", "-n", f"slurmrt-guard-{job.id}", "-o", "%i", check=False).strip()


def drive(trial: Trial, mtbf_s: float, steps: int, timeout_s: float) -> str:
    """Inject faults into the trial's job until it ends; returns the verdict's detail ('' for none)."""
    mark: tuple[int, int] | None = None
    since = 0.0
    deadline = time.monotonic() + timeout_s
    while not settled(trial.job):
        if time.monotonic() > deadline:
            slurm("scancel", trial.job.id, check=False)
            return "timeout"
        saved = newest_save(trial.directory, trial.job)
        if saved is None or saved[0] <= since or (mark is not None and saved[1:] <= mark):
            if "ReqNodeNotAvail" in (trial.job.info() or [{}])[0].get("Reason", ""):
                # The lost node, and the nodes its requeues excluded (a hang's, a crash's: right when they were
                # made), leave too few for the job in this 4-node partition: an admin returns the lost node.
                trial.restore()
            time.sleep(0.5)
            continue
        trial.restore()  # a later run saved: the node it lost may serve again
        pause = trial.rng.expovariate(1.0 / mtbf_s)
        kind = trial.rng.choices(KINDS, weights=WEIGHTS)[0]
        target = trial.rng.randrange(1024)
        time.sleep(pause)
        if trial.job.state() != "RUNNING" or not trial.inject(kind, target, steps):
            continue
        trial.faults[kind] += 1
        print(f"  trial {trial.number}: {kind} after {pause:.1f} s", flush=True)
        mark, since = (None, time.time()) if kind == "second-job" else (saved[1:], 0.0)
    return ""


def judge(trial: Trial, expected: list[float], mtbf_s: float, steps: int, timeout_s: float) -> str:
    try:
        if drive(trial, mtbf_s, steps, timeout_s) == "timeout":
            return "timeout"
        info = trial.job.wait(120)
    finally:
        trial.restore()
        for other in trial.others:
            slurm("scancel", other.id, check=False)
    if trial.problems:
        return "lost"
    if info.get("JobState") != "COMPLETED" and not finished(trial.directory):
        return "dead"
    if final_weights(trial.directory) != expected:
        return "lost"
    for wrong in (from_scratch(trial.directory), continuity(trial.directory)):  # the simulator's judge's checks
        if wrong is not None:
            trial.problems.append(wrong)
            return "lost"
    time.sleep(1)
    return "leftover" if processes(trial.job.id) else "survived"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=50, help="start no trial once this many faults were injected")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mtbf", type=float, default=6.0, help="mean seconds between a run's checkpoint and a fault")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one trial may take")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if min(args.faults, args.mtbf, args.steps, args.timeout) <= 0:
        p.error("--faults, --mtbf, --steps and --timeout must be positive")
    work = Path(tempfile.mkdtemp(prefix="slurmrt-chaos-cluster-", dir="/tmp"))
    work.chmod(0o755)
    started = time.monotonic()
    faults: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    number = 0
    try:
        reference = submit(work / "reference", "srun " + worker(args.steps), "-N2", "--ntasks-per-node=1",
                           name="chaos-reference")
        if reference.wait(900).get("JobState") != "COMPLETED" or (expected := final_weights(reference.dir)) is None:
            raise SystemExit(f"the uninterrupted reference job failed:\n{reference.output()[-3000:]}")
        while sum(faults.values()) < args.faults:
            directory = work / f"trial-{number:03d}"
            trial = Trial(number, directory, start_job(directory, number, args.steps),
                          random.Random(args.seed * 100_003 + number))
            verdict = judge(trial, expected, args.mtbf, args.steps, args.timeout)
            for kind, n in trial.faults.items():
                faults[(kind, verdict)] += n
            said = ", ".join(f"{n} {k}" for k, n in sorted(trial.faults.items())) or "no fault"
            print(f"trial {number} job {trial.job.id} ({said}): {verdict}", flush=True)
            if verdict != "survived":
                failures.append(f"seed {args.seed} trial {number} job {trial.job.id}: {verdict}: "
                                f"{'; '.join(trial.problems)} {trial.job.output()[-1500:]}")
            number += 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return summarize(f"the test cluster (4 nodes); seed {args.seed}, {number} trials in "
                     f"{time.monotonic() - started:.0f} s; command: python -m benchmarks.chaos_cluster --faults "
                     f"{args.faults} --seed {args.seed} --mtbf {args.mtbf:g} --steps {args.steps}", faults, failures,
                     KINDS)


if __name__ == "__main__":
    sys.exit(main())
