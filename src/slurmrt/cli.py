"""The ``slurmrt`` command line. Exit codes: 0 success, 1 a check failed, 2 bad usage or input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import hostlist
from ._errors import SlurmrtError

__all__ = ["main"]


def _hostnames(args: argparse.Namespace) -> int:
    for host in hostlist.expand(args.expression):
        print(host)
    return 0


def _hostlist(args: argparse.Namespace) -> int:
    print(hostlist.compress(args.hosts))
    return 0


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
