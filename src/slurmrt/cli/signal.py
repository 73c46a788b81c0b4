"""``slurmrt signal``: send a signal to this node's training processes of a job, not to launchers.

Sends SIG to every process on this node that called slurmrt.init() in the job (they register their pid in a
node-local directory). Launchers such as torchrun and `accelerate launch` die of SIGUSR1, so a `--signal=B:USR1`
warning must go to the training processes only. Exit 1 when no process was found.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .._errors import SlurmrtError
from ..launch.slurmvars import job_id, node_name
from ..stop.pidfiles import registered
from ..stop.signals import parse_signal
from ._common import add_command


def run(args: argparse.Namespace) -> int:
    try:
        sig = parse_signal(args.signal)
    except ValueError as err:
        raise SlurmrtError(str(err)) from None
    pids = signal_training(sig, args.job or job_id(os.environ))
    host = node_name(os.environ) or os.uname().nodename
    if not pids:
        job = args.job or job_id(os.environ)
        print(f"slurmrt signal: no training process of {f'job {job}' if job else 'this user outside a job'} is "
              f"registered on {host}: nothing was signalled (processes register at slurmrt.init(); inside a job, run "
              "this on the job's nodes, e.g. srun --overlap --jobid=JOB slurmrt signal USR1)")
        return 1
    print(f"slurmrt signal: {sig.name} to {len(pids)} training process(es) on {host}: {' '.join(map(str, pids))}")
    return 0


def signal_training(sig: int, job_id: str | None) -> list[int]:
    """Send ``sig`` to this node's training processes of the job (those registered by slurmrt.init(), still the
    process that registered: see :mod:`slurmrt.stop.pidfiles`)."""
    signalled = []
    for process in registered(job_id):
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:  # ended since the check
            continue
        signalled.append(process.pid)
    return signalled


def add_parser(sub: Any) -> None:
    p = add_command(sub, "signal", run, doc=__doc__,
                    help="send a signal to this node's training processes of the job, not launchers",
                    epilog="example (in an sbatch script with --signal=B:USR1@300):\n"
                           "  trap 'srun --overlap --ntasks-per-node=1 slurmrt signal USR1' USR1")
    p.add_argument("signal", help="USR1, SIGUSR1 or a number")
    p.add_argument("--job", help="job id (default: $SLURM_JOB_ID)")
