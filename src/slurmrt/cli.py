"""The ``slurmrt`` command line. Exit codes: 0 success, 1 a check failed, 2 bad usage or input."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from . import _commands, cuda, hostlist
from ._errors import SlurmrtError

__all__ = ["main"]


def _hostnames(args: argparse.Namespace) -> int:
    for host in hostlist.expand(args.expression):
        print(host)
    return 0


def _hostlist(args: argparse.Namespace) -> int:
    print(hostlist.compress(args.hosts))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from .sim.runner import SimInterrupted, simulate
    from .sim.spec import JobSpec, apply_option, parse_sbatch_script

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    spec = JobSpec(kill_wait_s=args.kill_wait, grace_s=args.grace, max_restarts=args.max_restarts)
    if command and command[0].endswith((".sbatch", ".sh")) and Path(command[0]).is_file() and len(command) == 1:
        spec, ignored = parse_sbatch_script(Path(command[0]), spec)
        if ignored:
            print(f"slurmrt sim: ignoring #SBATCH options it does not simulate: {' '.join(ignored)}", file=sys.stderr)
    elif command:
        spec = replace(spec, command=tuple(command))
    else:
        raise SlurmrtError("nothing to run: give `-- COMMAND ...` or a batch script")
    for name, value in (("nodes", args.nodes), ("ntasks-per-node", args.ntasks_per_node), ("time", args.time),
                        ("signal", args.signal), ("job-name", args.job_name)):
        if value is not None:
            spec = apply_option(spec, name, str(value))
    if args.requeue:
        spec = replace(spec, requeue=True)
    if args.fail_node is not None and args.at is None:
        raise SlurmrtError("--fail-node needs --at SECONDS (when the node fails)")
    spec = replace(spec, preempt_at_s=args.preempt_at, cancel_at_s=args.cancel_at, fail_node=args.fail_node,
                   fail_at_s=args.at, after_checkpoint=args.after_checkpoint)
    if args.fail_node is not None and not 0 <= args.fail_node < spec.nodes:
        raise SlurmrtError(f"--fail-node {args.fail_node}: nodes are numbered 0..{spec.nodes - 1}")
    try:
        records = simulate(spec)
    except SimInterrupted as stop:
        return 128 + stop.signum
    last = records[-1]
    return 0 if last.exit_code == 0 and last.ended_by == "finished" else 1


def _parallel(args: argparse.Namespace) -> cuda.ParallelConfig:
    if args.megatron_args:
        return cuda.parse_megatron_args(shlex.split(args.megatron_args))
    return cuda.ParallelConfig(tp=args.tp, pp=args.pp, cp=args.cp, fsdp=args.fsdp, moe_overlap=args.moe_overlap)


def _env(args: argparse.Namespace) -> int:
    config = _parallel(args)
    arch = cuda.gpu_arch_major() if cuda.node_gpu_count(os.environ) else None
    for line in _commands.env_exports(os.environ, config, args.gpus_per_node, arch):
        print(line)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    dirs = args.events or _commands.default_dirs(os.environ)
    report = _commands.doctor(os.environ, _parallel(args), events_dirs=dirs)
    print("slurmrt doctor")
    print("\n".join(report.lines))
    return 1 if report.failed else 0


def _kill(args: argparse.Namespace) -> int:
    watchers = _commands.kill(args.path, events_dirs=args.events or _commands.default_dirs(os.environ))
    print(f"created kill switch {args.path}")
    if watchers:
        print("watched by (from the event logs):")
        for w in watchers:
            print(f"  {w}")
    else:
        print("no event log found that mentions it (pass --events DIR to search a checkpoint directory)")
    return 0


def _status(args: argparse.Namespace) -> int:
    for line in _commands.status(args.dirs or _commands.default_dirs(os.environ)):
        print(line)
    return 0


def _signal(args: argparse.Namespace) -> int:
    from .signals import parse_signal

    try:
        sig = parse_signal(args.signal)
    except ValueError as err:
        raise SlurmrtError(str(err)) from None
    pids = _commands.signal_training(sig, args.job or os.environ.get("SLURM_JOB_ID"))
    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    print(f"slurmrt signal: {sig.name} to {len(pids)} training process(es) on {host}: {' '.join(map(str, pids))}")
    return 0 if pids else 1


def _add_events(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--events", type=Path, action="append", help=f"checkpoint dir or event log {what} (repeatable; "
                                                                 "default: $SLURMRT_CHECKPOINT_DIR, else .)")


def _add_parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size")
    p.add_argument("--fsdp", action="store_true", help="Torch-FSDP2 or Megatron-FSDP")
    p.add_argument("--moe-overlap", action="store_true", help="overlap_moe_expert_parallel_comm")
    p.add_argument("--megatron-args", help="Megatron's command line, quoted, instead of the flags above")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurmrt", description="PyTorch training jobs that survive SLURM.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("hostnames", help="expand a hostlist, one host per line (like scontrol show hostnames)",
                       epilog="example: slurmrt hostnames 'gpu[001-003,7]'")
    p.add_argument("expression")
    p.set_defaults(func=_hostnames)

    p = sub.add_parser("hostlist", help="compress host names into a hostlist (like scontrol show hostlist)",
                       epilog="example: slurmrt hostlist gpu001 gpu002 gpu003")
    p.add_argument("hosts", nargs="+")
    p.set_defaults(func=_hostlist)

    p = sub.add_parser(
        "sim", help="run a command or batch script as a Slurm job on this machine (signals, limits, requeue)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Runs COMMAND as a job of N nodes x M tasks on this machine, with the environment of a real srun "
                    "step, and does to it what Slurm would: the time limit, --signal, preemption, scancel, a node "
                    "failure, requeue. Prints a summary of every run of the job at the end. Exit code: 0 when the "
                    "last run finished with 0, 1 otherwise, 2 for bad usage.",
        epilog="examples:\n"
               "  slurmrt sim --nodes 2 --ntasks-per-node 2 --time 1:00 --signal USR1@20 --requeue -- python train.py\n"
               "  slurmrt sim --nodes 2 --preempt-at 15 --grace 10 --signal USR1@5 --requeue -- python train.py\n"
               "  slurmrt sim job.sbatch          # reads its #SBATCH lines; srun inside starts the tasks")
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("--ntasks-per-node", type=int)
    p.add_argument("-t", "--time", help="time limit, as sbatch: minutes, MM:SS or HH:MM:SS")
    p.add_argument("--signal", help="[B:]SIG@SECONDS, as sbatch")
    p.add_argument("--requeue", action="store_true", help="the job may be requeued")
    p.add_argument("-J", "--job-name")
    p.add_argument("--kill-wait", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL (Slurm's KillWait)")
    p.add_argument("--preempt-at", type=float, metavar="SECS", help="preempt the first run after SECS")
    p.add_argument("--grace", type=float, default=20.0, metavar="SECS", help="preemption grace time")
    p.add_argument("--cancel-at", type=float, metavar="SECS", help="scancel the first run after SECS")
    p.add_argument("--fail-node", type=int, metavar="N", help="SIGKILL the tasks of node N (0-based) ...")
    p.add_argument("--at", type=float, metavar="SECS", help="... after SECS of the first run")
    p.add_argument("--after-checkpoint", action="store_true",
                   help="count --preempt-at, --cancel-at and --at from the first run's first committed checkpoint "
                        "instead of its start, so the fault certainly hits a running job, on a fast or slow machine")
    p.add_argument("--max-restarts", type=int, default=5)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS..., or a batch script")
    p.set_defaults(func=_sim)

    p = sub.add_parser("env", help="print export lines for an sbatch script (MASTER_ADDR, NNODES, ...)",
                       description="Prints shell `export` lines derived from the allocation: MASTER_ADDR, MASTER_PORT, "
                                   "NNODES, GPUS_PER_NODE, WORLD_SIZE and CUDA_DEVICE_MAX_CONNECTIONS by the rules. "
                                   "Exit 2 outside an allocation.",
                       epilog="example (in an sbatch script): eval \"$(slurmrt env --tp 4)\"")
    _add_parallel(p)
    p.add_argument("--gpus-per-node", type=int, help="default: what the node shows (SLURM_GPUS_ON_NODE, NVML)")
    p.set_defaults(func=_env)

    p = sub.add_parser("doctor", help="preflight report inside an allocation; exit 1 if something would break the job",
                       description="Checks the derived topology, the master address and port, the time left, whether "
                                   "the job can be requeued, the --signal lead time against the measured save time, "
                                   "GPUs and CUDA_DEVICE_MAX_CONNECTIONS, and /dev/shm. Exit 0: nothing would break "
                                   "the job (warnings may remain); 1: something would.",
                       epilog="example: srun --ntasks-per-node=1 slurmrt doctor --tp 2 --events /shared/ckpt/run17")
    _add_parallel(p)
    _add_events(p, "to read save times from")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("kill", help="create a kill switch, and say which jobs watch it",
                       description="Creates PATH. Every job started with that kill switch saves, stops and exits 0 "
                                   "without requeue; tasks of an array not yet started exit at init.",
                       epilog="example: slurmrt kill /shared/stop-run17 --events /shared/ckpt/run17")
    p.add_argument("path", type=Path)
    _add_events(p, "to search for jobs that watch the switch")
    p.set_defaults(func=_kill)

    p = sub.add_parser("signal", help="send a signal to this node's training processes of the job, not launchers",
                       description="Sends SIG to every process on this node that called slurmrt.init() in the job "
                                   "(they register their pid in a node-local directory). Launchers such as torchrun "
                                   "and `accelerate launch` die of SIGUSR1, so a `--signal=B:USR1` warning must go to "
                                   "the training processes only. Exit 1 when no process was found.",
                       epilog="example (in an sbatch script with --signal=B:USR1@300):\n"
                              "  trap 'srun --overlap --ntasks-per-node=1 slurmrt signal USR1' USR1",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("signal", help="USR1, SIGUSR1 or a number")
    p.add_argument("--job", help="job id (default: $SLURM_JOB_ID)")
    p.set_defaults(func=_signal)

    p = sub.add_parser("status", help="restarts, stop reasons, checkpoints and lost time, from the event log",
                       epilog="example: slurmrt status /shared/ckpt/run17")
    p.add_argument("dirs", type=Path, nargs="*", help="checkpoint dirs or event logs (default: "
                                                      "$SLURMRT_CHECKPOINT_DIR, else the current directory)")
    p.set_defaults(func=_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SlurmrtError as err:
        print(f"slurmrt {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
