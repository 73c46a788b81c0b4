"""``slurmrt sim``: run a command or batch script as a Slurm job on this machine.

Runs COMMAND as a job of N nodes x M tasks on this machine, with the environment of a real srun step, and does to it
what Slurm would: the time limit, --signal, preemption, scancel, a node failure, requeue. Prints a summary of every
run of the job at the end. Exit code: 0 when the last run finished with 0, 1 otherwise, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from ._common import add_command

#: The requeues a job with a fault trace is granted unless --max-restarts says: its faults end many runs.
MAX_RESTARTS_TRACED = 1000
#: --mtbf draws this many mean times between failures of faults: far more than a rehearsal lives through.
DRAWN = 1000


def run(args: argparse.Namespace) -> int:
    from ..sim.job import SimInterrupted, simulate

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    _check_usage(args, command)
    spec = _spec(args, command)
    try:
        records = simulate(spec)
    except SimInterrupted as stop:
        return 128 + stop.signum
    missed = _not_rehearsed(spec, records)
    for what in missed:
        print(f"slurmrt sim: not rehearsed: {what}; exit 1", file=sys.stderr)
    last = records[-1]
    return 0 if last.exit_code == 0 and last.ended_by == "finished" and not missed else 1


def _spec(args: argparse.Namespace, command: list[str]) -> Any:
    """The job the command line asks for: its script's #SBATCH lines, then the flags, the faults."""
    from ..sim.spec import JobSpec, apply_option

    traced = args.mtbf is not None or args.trace is not None
    restarts = args.max_restarts if args.max_restarts is not None else (MAX_RESTARTS_TRACED if traced else 5)
    spec = _job(JobSpec(kill_wait_s=args.kill_wait, grace_s=args.grace, max_restarts=restarts,
                        requeue_wait_s=args.requeue_wait), command)
    for name, value in (("nodes", args.nodes), ("ntasks-per-node", args.ntasks_per_node), ("time", args.time),
                        ("signal", args.signal), ("job-name", args.job_name)):
        if value is not None:
            spec = apply_option(spec, name, str(value))
    if args.requeue or traced:
        spec = replace(spec, requeue=True)
    return _traced(args, _faults(args, spec))


def _not_rehearsed(spec: Any, records: list[Any]) -> list[str]:
    """What the user asked to rehearse that did not happen, with why: a fault that never fired, a slowed node that
    nobody named. Such a run must not look survived."""
    # Shape: one test per rehearsed fault, each with its own why, in the order the flags are documented
    missed = [m for r in records for m in r.missed]
    if spec.slow_node is not None and not any(r.stragglers for r in records):
        missed.append(f"slow-node {spec.slow_node}: it was slowed, but no straggler was named. slurmrt judges the "
                      "section the job times with rt.time_compute(), over straggler_windows windows of "
                      "straggler_window timed steps (3 x 20 by default): time the job's compute, and run it long "
                      "enough")
    if not any(r.unhealthy_steps for r in records):
        missed += [f"{name} {getattr(spec, name)[0]}:{getattr(spec, name)[1]}: {why}"
                   for name, why in _UNSEEN.items() if getattr(spec, name) is not None]
    return missed

#: Why a rehearsed training-health fault was not found, by its flag.
_UNSEEN = {
    "nan": "no rank found an unhealthy step. The NaN is put into the loss rt.check(step, loss=...) is given: call it "
           "every step, and run past that step",
    "flip": "no rank found its replicas differ. The bit flips in what rt.check(step, replicas=model) is given, and the "
            "hashes are compared every health_hash_every steps: pass the replicas, and run past the next comparison",
    "spike": "no rank found an unhealthy step. A spike is judged against at least 20 healthy losses before it: give "
             "rt.check(step, loss=...) every step, from 20 steps before that one",
}


def _job(spec: Any, command: list[str]) -> Any:
    """``spec`` running ``command``: a batch script (its #SBATCH lines read), or a command line."""
    from ..sim.spec import parse_sbatch_script

    if command and command[0].endswith((".sbatch", ".sh")) and Path(command[0]).is_file() and len(command) == 1:
        spec, ignored = parse_sbatch_script(Path(command[0]), spec)
        if ignored:
            print(f"slurmrt sim: ignoring #SBATCH options it does not simulate: {' '.join(ignored)}", file=sys.stderr)
        return spec
    if not command:
        raise SlurmrtError("nothing to run: give `-- COMMAND ...` or a batch script")
    return replace(spec, command=tuple(command))


def _faults(args: argparse.Namespace, spec: Any) -> Any:
    """The faults and the in-job recovery set-up of the command line, onto ``spec``; checked."""
    if args.no_kill:
        spec = replace(spec, no_kill=True)
    if args.spare_nodes:
        if spec.script is not None:
            raise SlurmrtError("--spare-nodes writes the batch script's `slurmrt run` line: with a batch script of "
                               "your own, put `exec slurmrt run --spare-nodes S -- ...` in it instead")
        if not 0 < args.spare_nodes < spec.nodes:
            raise SlurmrtError(f"--spare-nodes {args.spare_nodes} of --nodes {spec.nodes}: at least one node must "
                               f"train (--nodes counts the spares too, as #SBATCH --nodes does)")
    if not args.slow_factor > 1:
        raise SlurmrtError(f"--slow-factor {args.slow_factor}: more than 1 (4: its tasks take 4x as long)")
    spec = replace(spec, preempt_at_s=args.preempt_at, cancel_at_s=args.cancel_at, fail_node=args.fail_node,
                   fail_at_s=args.at, after_checkpoint=args.after_checkpoint, hang_task=args.hang_task,
                   unhealthy_node=args.unhealthy_node, spare_nodes=args.spare_nodes or 0, slow_node=args.slow_node,
                   slow_factor=args.slow_factor, nan=_task_step("--nan", args.nan, spec.ntasks),
                   nan_repeats=args.nan_repeats, flip=_task_step("--flip", args.flip, spec.ntasks),
                   spike=_task_step("--spike", args.spike, spec.ntasks))
    for flag, value, count, what in (("--fail-node", args.fail_node, spec.nodes, "nodes"),
                                     ("--unhealthy-node", args.unhealthy_node, spec.nodes, "nodes"),
                                     ("--slow-node", args.slow_node, spec.nodes, "nodes"),
                                     ("--hang-task", args.hang_task, spec.ntasks, "tasks")):
        if value is not None and not 0 <= value < count:
            raise SlurmrtError(f"{flag} {value}: {what} are numbered 0..{count - 1}")
    return spec


def _task_step(flag: str, text: str | None, ntasks: int) -> tuple[int, int] | None:
    """``--nan``, ``--flip`` or ``--spike`` ``TASK:STEP``, its task one of the job's ``ntasks``."""
    if text is None:
        return None
    task, _, step = text.partition(":")
    if not (task.isdigit() and step.isdigit()):
        raise SlurmrtError(f"{flag} {text!r}: TASK:STEP, two whole numbers (1:40: task 1, at step 40)")
    if int(task) >= ntasks:
        raise SlurmrtError(f"{flag} {text}: tasks are numbered 0..{ntasks - 1}")
    return int(task), int(step)


def _traced(args: argparse.Namespace, spec: Any) -> Any:
    """The faults of ``--mtbf`` (drawn from ``--seed``) or ``--trace``, onto ``spec``."""
    from ..sim.faults import draw, parse_duration, parse_weights, read_trace

    if args.mtbf is not None and args.trace is not None:
        raise SlurmrtError("--mtbf draws the faults and --trace reads them: give one of them")
    if args.mtbf is None and (args.fault_weights is not None or args.seed is not None):
        raise SlurmrtError("--seed and --fault-weights go with --mtbf (they say how its faults are drawn)")
    if args.trace is not None:
        return replace(spec, faults=tuple(read_trace(Path(args.trace))), fault_source=f"trace {args.trace}")
    if args.mtbf is None:
        return spec
    mtbf, seed = parse_duration(args.mtbf), args.seed if args.seed is not None else 0
    faults = draw(mtbf, seed, horizon_s=mtbf * DRAWN, weights=parse_weights(args.fault_weights))
    return replace(spec, faults=tuple(faults), fault_source=f"MTBF {args.mtbf}, seed {seed}")


def _check_usage(args: argparse.Namespace, command: list[str]) -> None:
    """What the simulator would otherwise run and misreport: a command that does not exist (it "ran" and exited
    127), a negative time, a failure time with nothing to fail."""
    if command and shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise SlurmrtError(f"{command[0]!r}: no such batch script or command (give `-- COMMAND ...` or a batch "
                           "script that exists)")
    for flag, value in (("--kill-wait", args.kill_wait), ("--grace", args.grace), ("--preempt-at", args.preempt_at),
                        ("--cancel-at", args.cancel_at), ("--at", args.at), ("--max-restarts", args.max_restarts),
                        ("--seed", args.seed), ("--requeue-wait", args.requeue_wait)):
        if value is not None and not value >= 0:
            raise SlurmrtError(f"{flag} {value}: a time or count, 0 or more")
    _check_timed_faults(args)


def _check_timed_faults(args: argparse.Namespace) -> None:
    """--at and the faults it times come together."""
    if args.at is not None and args.fail_node is None and args.hang_task is None:
        raise SlurmrtError("--at SECONDS says when --fail-node or --hang-task happens: give one of them, or drop --at")
    if (args.fail_node is not None or args.hang_task is not None) and args.at is None:
        raise SlurmrtError("--fail-node and --hang-task need --at SECONDS (when it happens)")


def add_parser(sub: Any) -> None:
    p = add_command(sub, "sim", run, doc=__doc__,
                    help="run a command or batch script as a Slurm job on this machine (signals, limits, requeue)",
                    epilog="examples:\n"
                           "  slurmrt sim --nodes 2 --ntasks-per-node 2 --time 2:00 --signal USR1@20 --requeue \\\n"
                           "      -- python train.py --checkpoint-dir ckpt\n"
                           "  slurmrt sim --nodes 2 --preempt-at 15 --grace 10 --signal USR1@5 --requeue \\\n"
                           "      -- python train.py --checkpoint-dir ckpt\n"
                           "  slurmrt sim job.sbatch          # reads its #SBATCH lines; srun inside starts the tasks")
    p.add_argument("-N", "--nodes", type=int, help="nodes of the job, spares included, as sbatch (default: 1, or the "
                                                   "script's #SBATCH line)")
    p.add_argument("--ntasks-per-node", type=int, help="tasks on each node, as sbatch (default: 1, or the script's)")
    p.add_argument("-t", "--time", help="time limit, as sbatch: minutes, MM:SS or HH:MM:SS (default: none)")
    p.add_argument("--signal", help="[B:]SIG@SECONDS, as sbatch: the warning before the time limit (default: none)")
    p.add_argument("--requeue", action="store_true", help="the job may be requeued")
    p.add_argument("-J", "--job-name", help="the job's name, SLURM_JOB_NAME (default: sim, or the script's)")
    p.add_argument("--kill-wait", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL (Slurm's KillWait)")
    p.add_argument("--preempt-at", type=float, metavar="SECS", help="preempt the first run after SECS")
    p.add_argument("--grace", type=float, default=20.0, metavar="SECS", help="preemption grace time")
    p.add_argument("--cancel-at", type=float, metavar="SECS", help="scancel the first run after SECS")
    p.add_argument("--fail-node", type=int, metavar="N", help="SIGKILL the tasks of node N (0-based) ...")
    p.add_argument("--hang-task", type=int, metavar="N", help="freeze task N (SIGSTOP: a hang) ...")
    p.add_argument("--at", type=float, metavar="SECS", help="... after SECS of the first run")
    p.add_argument("--unhealthy-node", type=int, metavar="N",
                   help="node N (0-based) fails slurmrt's health check (init(health_check=True)) until excluded")
    p.add_argument("--nan", metavar="TASK:STEP", help="task TASK's loss of step STEP is NaN in rt.check, in the first "
                                                      "run (a transient fault)")
    p.add_argument("--nan-repeats", action="store_true",
                   help="... in every run, each time its process reaches the step (a bad batch: reproducible)")
    p.add_argument("--flip", metavar="TASK:STEP", help="a bit of task TASK's replicas (rt.check(..., replicas=model)) "
                                                       "flips at step STEP, in the first run: silent corruption")
    p.add_argument("--spike", metavar="TASK:STEP", help="task TASK's loss of step STEP spikes in rt.check, in every "
                                                        "run (a batch that causes it: reproducible)")
    p.add_argument("--after-checkpoint", action="store_true",
                   help="count --preempt-at, --cancel-at and --at from the first run's first committed checkpoint "
                        "instead of its start, so the fault certainly hits a running job, on a fast or slow machine")
    p.add_argument("--no-kill", action="store_true",
                   help="a failed node leaves the job (--fail-node kills its tasks) and the job goes on, as sbatch -k")
    p.add_argument("--spare-nodes", type=int, metavar="S",
                   help="run COMMAND under `slurmrt run --spare-nodes S`: S of the --nodes stay spare for in-job "
                        "restarts")
    p.add_argument("--slow-node", type=int, metavar="N",
                   help="node N (0-based) is slow: the CPU time its tasks run is charged K-1 times over as a stop "
                        "(SIGSTOP/SIGCONT), until excluded")
    p.add_argument("--slow-factor", type=float, default=4.0, metavar="K", help="how much slower")
    p.add_argument("--max-restarts", type=int,
                   help="requeues the simulator grants, as Slurm's MaxBatchRequeue (then the job ends); default 5, "
                        f"{MAX_RESTARTS_TRACED} with --mtbf or --trace")
    p.add_argument("--requeue-wait", type=float, default=0.0, metavar="SECS",
                   help="a requeued job starts its next run after SECS (Slurm holds it at least its credential "
                        "lifetime, 120 s by default, then it queues; default 0: at once)")
    p.add_argument("--mtbf", metavar="DURATION",
                   help="faults over the job's life, exponential inter-arrival times of this mean (90s, 10m, 1.5h), "
                        "on the job's clock (its runs' time, summed; with --after-checkpoint, each run's from its "
                        "first checkpoint); implies --requeue")
    p.add_argument("--seed", type=int, help="the seed --mtbf draws its faults from (default: 0): the same seed, "
                                            "the same faults")
    p.add_argument("--fault-weights", metavar="KIND=W,...",
                   help="how often each kind comes with --mtbf: node-loss, rank-crash, hang, preemption "
                        "(default: node-loss=4,rank-crash=3,hang=2,preemption=1)")
    p.add_argument("--trace", metavar="CSV",
                   help="replay the faults of a CSV file instead: time,kind[,node] per line (time in seconds or "
                        "with a unit); implies --requeue")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS..., or a batch script")
