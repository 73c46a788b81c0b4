"""``slurmrt hostnames`` and ``slurmrt hostlist``: Slurm's hostlist expressions, both ways."""

from __future__ import annotations

import argparse
from typing import Any

from ..launch import hostlist


def run(args: argparse.Namespace) -> int:
    for host in hostlist.expand(args.expression):
        print(host)
    return 0


def run_compress(args: argparse.Namespace) -> int:
    print(hostlist.compress(args.hosts))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("hostnames", help="expand a hostlist, one host per line (like scontrol show hostnames)",
                       epilog="example: slurmrt hostnames 'gpu[001-003,7]'")
    p.add_argument("expression", help="a hostlist, as Slurm writes it: n[1-3],gpu[07-08]")
    p.set_defaults(func=run, command_name="hostnames")

    p = sub.add_parser("hostlist", help="compress host names into a hostlist (like scontrol show hostlist)",
                       epilog="example: slurmrt hostlist gpu001 gpu002 gpu003")
    p.add_argument("hosts", nargs="+", help="host names")
    p.set_defaults(func=run_compress, command_name="hostlist")
