"""``slurmrt nodes``: the nodes your jobs found bad, remembered across jobs (the bad-node ledger).

slurmrt writes a node down when its recovery leaves it out of a job: it hung, it was lost, or it failed the health
check. Your next jobs avoid it: a requeue adds it to the job's ExcNodeList, and slurmrt run keeps it as a last-resort
spare. An entry is forgotten 24 h after it was last seen failing. With --sbatch, print the option that keeps a new
job off these nodes; with --clear, forget nodes (all, or those named) once they are repaired.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

from ..launch import hostlist
from ..launch.slurmvars import cluster_name
from ..record.ledger import Ledger, ledger_path
from ..recovery.exclusion import partition_nodes
from ._common import add_command


def run(args: argparse.Namespace) -> int:
    cluster = args.cluster or cluster_name(os.environ) or _default_cluster()
    ledger = Ledger(ledger_path(os.environ, cluster))
    if args.clear is not None:
        gone = ledger.clear(hostlist.expand(",".join(args.clear)) if args.clear else None)
        print(f"forgot {hostlist.compress(gone)}" if gone else "nothing to forget")
    elif args.sbatch:
        nodes = _capped(ledger.nodes(), args.partition, args.nodes, args.max)
        if nodes:
            print(f"--exclude={hostlist.compress(sorted(nodes))}")
    else:
        _list(ledger, cluster or "local")
    return 0


def _capped(nodes: list[str], partition: str | None, needed: int, most: int) -> list[str]:
    """The ledger's nodes (the most recently seen first) that a new job may leave out and still run: at most
    ``most``, and, when the partition's size is known (``sinfo``), never more than half of it nor so many that fewer
    than ``needed`` nodes remain. What is left out of the exclusion is said in one line on stderr."""
    limit = most
    total = partition_nodes(partition) if partition else None
    if total is not None:
        limit = max(0, min(limit, total // 2, total - needed))
    if len(nodes) > limit:
        where = f"partition {partition} has {total} node(s), the job needs {needed}; " if total is not None else ""
        print(f"slurmrt nodes: not excluded: {hostlist.compress(sorted(nodes[limit:]))} ({where}at most {limit} of "
              f"{len(nodes)} ledger node(s) excluded, the most recently failed first; --max and --nodes set it)",
              file=sys.stderr)
    return nodes[:limit]


def _list(ledger: Ledger, cluster: str) -> None:
    entries = ledger.entries()
    if not entries:
        print(f"no bad nodes remembered for cluster {cluster} ({ledger.path})")
        return
    print(f"bad nodes of cluster {cluster} ({ledger.path}):")
    for e in sorted(entries.values(), key=lambda e: -e.last):
        when = datetime.datetime.fromtimestamp(e.last).strftime("%Y-%m-%d %H:%M")
        forget = datetime.datetime.fromtimestamp(e.last + ledger.ttl_s).strftime("%Y-%m-%d %H:%M")
        times = f", {e.count} times" if e.count > 1 else ""
        print(f"  {e.node}: {e.reason} (job {e.job or '?'}, last {when}{times}; forgotten after {forget})")
    print(f"keep a new job off them: sbatch --exclude={hostlist.compress(sorted(entries))} ...")


def _default_cluster() -> str | None:
    """The cluster this machine's Slurm belongs to (scontrol show config), when there is one to ask."""
    from .. import _slurm

    out = _slurm.run("scontrol", "show", "config", timeout_s=10.0)
    if isinstance(out, str) or out.returncode != 0:
        return None
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip() or None
    return None


def add_parser(sub: Any) -> None:
    p = add_command(sub, "nodes", run, doc=__doc__, help="list or clear the nodes your jobs found bad",
                    epilog="examples:\n  slurmrt nodes\n  sbatch $(slurmrt nodes --sbatch) job.sbatch\n"
                           "  slurmrt nodes --clear gpu017")
    p.add_argument("--cluster", help="the cluster whose ledger to read (default: $SLURM_CLUSTER_NAME, else the "
                                     "ClusterName of this machine's Slurm)")
    p.add_argument("--sbatch", action="store_true", help="print only --exclude=<nodes> for sbatch (nothing if none)")
    p.add_argument("--partition", help="with --sbatch: the partition the job asks for; its size (sinfo) caps the "
                                       "exclusion so that the job can still run")
    p.add_argument("--nodes", type=_positive, default=1, metavar="N",
                   help="with --sbatch and --partition: the job's node count, kept free (default 1)")
    p.add_argument("--max", type=_positive, default=4, metavar="K",
                   help="with --sbatch: at most K nodes excluded, the most recently failed first (default 4, as "
                        "max_excluded_nodes)")
    p.add_argument("--clear", nargs="*", metavar="NODE", help="forget these nodes (hostlists allowed), or all")




def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: 1 or more")
    return value
