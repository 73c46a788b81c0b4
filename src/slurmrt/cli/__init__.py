"""The ``slurmrt`` command line: one module per command, each with ``add_parser`` and ``run``.

Exit codes: 0 success, 1 a check failed, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import os
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


#: Options whose value is itself a command line, which starts with a dash: argparse would take it for an option.
_COMMAND_LINES = ("--srun-args", "--megatron-args")


def _joined(argv: Sequence[str]) -> list[str]:
    """``--srun-args '--gpus-per-task=1'`` as ``--srun-args=--gpus-per-task=1`` (the form argparse takes), before
    the ``--`` that starts the training's own command."""
    out, rest = list(argv), len(argv)
    if "--" in out:
        rest = out.index("--")
    i = 0
    while i < rest - 1:
        if out[i] in _COMMAND_LINES:
            out[i:i + 2] = [f"{out[i]}={out[i + 1]}"]
            rest -= 1
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_joined(sys.argv[1:] if argv is None else argv))
    if args.command is None:  # `slurmrt` alone: what it can do, not an error
        parser.print_help()
        return 0
    name = getattr(args, "command_name", "")
    args.parser = parser  # `slurmrt completion` writes its scripts from it
    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader went away (`slurmrt doctor | head -n 3`): what it wanted, it has
        _quiet_stdout()
        return 0
    except SlurmrtError as err:
        print(f"slurmrt {name}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file named on the command line that cannot be read: one line, not a traceback
        print(f"slurmrt {name}: {err}", file=sys.stderr)
        return 1


def _quiet_stdout() -> None:
    """Standard output to /dev/null: the interpreter's last flush must not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
