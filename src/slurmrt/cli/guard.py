"""``slurmrt guard``: the guard job that ``slurmrt run`` arms; it requeues a job whose batch node failed.

Submitted by ``slurmrt run`` with ``sbatch --dependency=afternotok:JOB``: it runs once JOB ended not COMPLETED, and
requeues it (without the node, written into your bad-node ledger) only when the job's batch node failed (which ends
a --no-kill job without a requeue) and the job's run had not ended for good (finished, stopped or failed, as its event
log says). Not a command to run by hand, though it is safe to: it reads the job and its event log before it acts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..launch.slurmvars import cluster_name
from ..options import Options
from ..record.events import EventLog
from ..record.ledger import Ledger
from ..recovery import injob
from ..recovery.facts import Facts
from ..recovery.guard import stand_guard
from ..recovery.settings import RecoverySection
from ._common import add_command, log_lines


def run(args: argparse.Namespace) -> int:
    if args.restart < 0:
        raise ConfigError(f"--restart {args.restart}: 0 or more")
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes}: 1 or more (the nodes the job was allocated)")
    env = dict(os.environ)
    facts, event_log = resolved(args, env)
    return log_lines(lambda: stand_guard(args.job, args.restart, args.batch_host, facts=facts,
                                         ledger=Ledger.of(env, cluster_name(env)), event_log=event_log),
                     "slurmrt guard")


def resolved(args: argparse.Namespace, env: dict[str, str]) -> tuple[Facts, Callable[[int], EventLog]]:
    """The facts the guard decides with and the job's event log: the options the newest step's training resolved
    (``--run-dir``: ``slurmrt run``'s record, read whole, as ``slurmrt run`` reads it), else the environment's, which
    is the one ``slurmrt run`` had."""
    options = Options.resolve({}, env)
    facts = Facts(job=args.job, policy=RecoverySection.of(options), restart_count=args.restart,
                  kill_switch=options.kill_switch, job_nodes=args.nodes)
    path, directory = options.event_log, options.checkpoint_dir
    learned = injob.newest_facts(args.run_dir) if args.run_dir is not None else None
    if learned is not None:
        facts, _ = facts.learned(learned, None)
        path, directory = (Path(learned["event_log"]) if learned["event_log"] else None), None
    return facts, lambda attempt: EventLog.for_job(path, directory, job=args.job, restart=args.restart, rank=-1,
                                                   env=env, attempt=attempt)


def add_parser(sub: Any) -> None:
    p = add_command(sub, "guard", run, doc=__doc__,
                    help="(armed by slurmrt run) requeue a job whose batch node failed",
                    epilog="as slurmrt run arms it:\n"
                           "  sbatch --dependency=afternotok:JOB --kill-on-invalid-dep=yes -N1 -n1 --wrap \\\n"
                           "    'python -m slurmrt guard JOB --restart N --batch-host NODE --nodes M'")
    p.add_argument("job", help="the job (ARRAY_TASK for a task of an array)")
    p.add_argument("--restart", type=int, required=True, metavar="N", help="the run that armed the guard")
    p.add_argument("--batch-host", required=True, metavar="NODE", help="the node its batch script ran on")
    p.add_argument("--nodes", type=int, metavar="N", help="the nodes the job was allocated (its requeue asks for as "
                                                         "many, however many it lost)")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="slurmrt run's directory: the options the training "
                                                              "resolved (its event log, its limits) are read there")
