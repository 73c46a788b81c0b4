"""``slurmrt run``: run the training step of a batch script, and replace it on a spare node when it fails.

Starts COMMAND with srun on all but --spare-nodes of the job's nodes, passes Slurm's warning signals
(--signal=B:USR1@secs) to the training processes only, and, when slurmrt in the training names a bad node (a hung
rank, a lost peer, a failed health check), starts a new step without it in the same job. With no spare left, at
--max-in-job-restarts, or when the same failure comes twice, the training requeues the job as it does without
`slurmrt run`. Exits with the last step's exit code. Allocate the spares with #SBATCH --nodes=N+S --no-kill.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..launch import launchline
from ..launch.slurmvars import Job, job_of
from ..options import Options
from ..record.events import EventLog
from ..record.ledger import Ledger
from ..recovery import guard
from ..recovery.evidence import Evidence
from ..recovery.exclusion import read_job
from ..recovery.facts import Facts
from ..recovery.settings import RecoverySection
from ..recovery.supervisor import STEP_WAIT_S, Supervisor, default_directory
from ..stop.signals import parse_signal
from ._common import add_command, log_lines


def run(args: argparse.Namespace) -> int:
    # Shape: argument checks, each with its own message, then the supervisor built once; the command's whole story
    import os

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("slurmrt run needs the training command after --, e.g. slurmrt run --spare-nodes 1 -- "
                          "python train.py")
    if args.max_in_job_restarts < 0:
        raise ConfigError(f"--max-in-job-restarts {args.max_in_job_restarts}: 0 or more")
    if args.step_wait < 0:
        raise ConfigError(f"--step-wait {args.step_wait}: 0 (no limit) or more seconds")
    forward = _forward(args.forward)
    try:
        srun_args = shlex.split(args.srun_args)
    except ValueError as err:
        raise ConfigError(f"--srun-args {args.srun_args!r}: {err} (one string, quoted as in a shell)") from None
    env = dict(os.environ)
    slurm_job = job_of(env)  # None outside a job: the supervisor says so
    job = slurm_job.id if slurm_job is not None else ""
    directory = Path(args.dir).resolve() / f".slurmrt-run-{job}" if args.dir else default_directory(env, job)
    # The job's options, read once here: the training reads the same variables, and a bad one fails it at init()
    # all the same; failing now costs seconds, not a step start. Once a step's training has resolved its own (in
    # code: checkpoint_dir=...), the supervisor learns those (Supervisor._learn).
    options = Options.resolve({}, env)
    _check_nodes(command, env, slurm_job, args.spare_nodes)
    supervisor = Supervisor(command, spare_nodes=args.spare_nodes, max_in_job_restarts=args.max_in_job_restarts,
                            env=env,
                            directory=directory, slurm_job=slurm_job, srun_args=srun_args, forward=forward,
                            wait_s=args.step_wait, refresh_s=options.end_time_refresh_s,
                            evidence=Evidence("srun", job, env, checkpoint_dir=options.checkpoint_dir),
                            **_recorded(options, slurm_job, env))
    if (args.spare_nodes > 0 if args.guard is None else args.guard) and options.requeue:
        log_lines(lambda: _arm(supervisor, env))
    return log_lines(supervisor.run)


def _check_nodes(command: list[str], env: dict[str, str], job: Job | None, spares: int) -> None:
    """Before the step starts: NNODES and a launcher's node count are the nodes the step runs on, or the job fails
    now with the fix, not in the launcher's rendezvous (which no init() check reaches). Outside a job, or with
    spares it cannot have, the supervisor says what is wrong."""
    allocated = len(job.nodes) if job is not None and job.nodes else 0
    if not allocated > spares >= 0:
        return
    nnodes = f"$((SLURM_NNODES - {spares}))" if spares else "$SLURM_NNODES"
    launchline.check(command, env, nodes=allocated - spares,
                     where=f"slurmrt run's step runs on the job's {allocated} less {spares} spare:",
                     fix=f"NNODES={nnodes} in the batch script, and the launcher's node count from it "
                         '(--nnodes "$NNODES", --num_machines "$NNODES")')


def _recorded(options: Options, slurm_job: Job | None, env: dict[str, str]) -> dict[str, Any]:
    """The supervisor's facts, bad-node ledger and event log, from the job's options and the Slurm job."""
    requeue_id, restart = (slurm_job.requeue_id, slurm_job.restart_count) if slurm_job is not None else ("", 0)
    return {"facts": Facts(job=requeue_id, policy=RecoverySection.of(options), restart_count=restart,
                           kill_switch=options.kill_switch),
            "ledger": Ledger.of(env, slurm_job.cluster if slurm_job is not None else None),
            "event_log": lambda attempt: EventLog.for_job(options.event_log, options.checkpoint_dir, job=requeue_id,
                                                          restart=restart, rank=-1, env=env, attempt=attempt)}


def _arm(supervisor: Supervisor, env: dict[str, str]) -> int:
    """The guard job for the batch node (:mod:`slurmrt.recovery.guard`); its output goes to the job's."""
    slurm_job = supervisor.slurm_job
    if slurm_job is None:  # refused when the supervisor was made; said for the type checker
        return 0
    info = read_job(supervisor.requeue_id)
    host = guard.batch_host(env)
    armed = guard.arm(slurm_job, host, events=supervisor.event_log(0),
                      output=None if isinstance(info, str) else info.std_out, nodes=len(supervisor.allocation),
                      run_dir=supervisor.directory)
    if armed is not None:
        print(f"slurmrt run: guard job {armed} requeues the job if this node ({host}) fails", file=sys.stderr,
              flush=True)
    return 0


def _forward(text: str) -> tuple[signal.Signals, ...]:
    """The signals of ``--forward``, each one the supervisor can catch and pass on."""
    try:
        forward = tuple(signal.Signals(parse_signal(s)) for s in text.split(",") if s)
    except ValueError as err:
        raise ConfigError(f"--forward {text!r}: {err}") from None
    # No process can catch KILL or STOP, and TERM and INT mean "no new step" to the supervisor (Slurm signals the
    # steps itself).
    refused = sorted(s.name for s in forward if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT))
    if refused:
        raise ConfigError(f"--forward {text!r}: {', '.join(refused)} cannot be passed on (KILL and STOP cannot be "
                          "caught; TERM and INT end the supervisor, and Slurm sends them to the steps itself). Use "
                          "USR1, USR2 or another catchable signal")
    return forward


def add_parser(sub: Any) -> None:
    p = add_command(sub, "run", run, doc=__doc__,
                    help="run the training step; on a failure, a new step on a spare node of the same job",
                    epilog="example (sbatch script):\n"
                           "  #SBATCH --nodes=3 --ntasks-per-node=1 --no-kill --requeue --signal=B:USR1@120\n"
                           "  exec slurmrt run --spare-nodes 1 -- python train.py\n"
                           "  (exec: the B: warning signal reaches slurmrt run, not a batch shell that dies of it)")
    p.add_argument("--spare-nodes", type=int, default=0, metavar="S",
                   help="nodes of the job kept out of the step, to replace a bad one (default 0)")
    p.add_argument("--max-in-job-restarts", type=int, default=3, metavar="K",
                   help="new steps within one run of the job before the requeue takes over (default 3)")
    p.add_argument("--forward", default="USR1,USR2", metavar="SIGS",
                   help="signals passed to the training processes (default USR1,USR2)")
    p.add_argument("--srun-args", default="", metavar="ARGS",
                   help="more srun options for the training step, as one string (e.g. '--gpus-per-task=1')")
    p.add_argument("--dir", metavar="PATH",
                   help="where the step leaves its restart request; every node must see it (default: the submit "
                        "directory)")
    p.add_argument("--step-wait", type=int, default=STEP_WAIT_S, metavar="S",
                   help="srun --wait of the step: tasks still running S seconds after one ended are ended (a "
                        "frozen task after the others finished); 0: no limit")
    p.add_argument("--guard", action=argparse.BooleanOptionalAction, default=None,
                   help="arm a guard job that requeues the job if its batch node fails, which --no-kill does not "
                        "cover (default: with --spare-nodes 1 or more, and requeue on)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
