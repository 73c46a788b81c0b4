"""The ``slurmrt`` command line: one module per command, each with ``add_parser`` and ``run``.

Exit codes: 0 success, 1 a check failed, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._errors import SlurmrtError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from . import completion, doctor, env, guard, hostnames, kill, nodes, run, signal, sim, status, verify

    parser = argparse.ArgumentParser(prog="slurmrt", description="PyTorch training jobs that survive SLURM.")
    parser.add_argument("--version", action="version", version=f"slurmrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (sim, run, status, verify, doctor, env, kill, signal, nodes, hostnames, guard, completion):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `slurmrt` alone: what it can do, not an error
        parser.print_help()
        return 0
    name = getattr(args, "command_name", "")
    args.parser = parser  # `slurmrt completion` writes its scripts from it
    try:
        return int(args.func(args))
    except SlurmrtError as err:
        print(f"slurmrt {name}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file named on the command line that cannot be read: one line, not a traceback
        print(f"slurmrt {name}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
