"""What several commands share: the parallel-size flags, finding event logs, and slurmrt's warnings as the
command's own lines."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..launch.parallel import ParallelConfig


def add_parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--cp", type=int, default=1, help="context-parallel size")
    p.add_argument("--fsdp", action="store_true", help="Torch-FSDP2 or Megatron-FSDP")
    p.add_argument("--moe-overlap", action="store_true", help="overlap_moe_expert_parallel_comm")
    p.add_argument("--megatron-args", help="Megatron's command line, quoted, instead of the flags above")


def parallel(args: argparse.Namespace, env: Mapping[str, str]) -> ParallelConfig:
    """The flags of :func:`add_parallel`, with NNODES / GPUS_PER_NODE from ``env`` (as init() reads them)."""
    try:
        megatron = shlex.split(args.megatron_args) if args.megatron_args else None
    except ValueError as err:  # an unbalanced quote
        raise ConfigError(f"--megatron-args {args.megatron_args!r}: {err}: give Megatron's command line as one "
                          "string, quoted as in a shell (--megatron-args \"--tensor-model-parallel-size 2 ...\")"
                          ) from None
    return ParallelConfig.declared(env, megatron_args=megatron, tp=args.tp, pp=args.pp, cp=args.cp, fsdp=args.fsdp,
                                   moe_overlap=args.moe_overlap)


def add_events(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--events", type=Path, action="append", help=f"checkpoint dir or event log {what} (repeatable; "
                                                                 "default: $SLURMRT_CHECKPOINT_DIR, else .)")


def default_dirs(env: Mapping[str, str]) -> list[Path]:
    return [Path(env["SLURMRT_CHECKPOINT_DIR"])] if env.get("SLURMRT_CHECKPOINT_DIR") else [Path(os.getcwd())]


def event_files(dirs: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            found = sorted(d.glob("events*.jsonl")) + sorted(d.glob("*/events*.jsonl"))
            files.extend(f for f in found if f.is_file())
    return files


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (wrapped by :func:`description`); each option's default after its help,
    unless it has none (None, a flag's False) or its help names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text and "default" not in text and action.default not in (None, False, "", argparse.SUPPRESS) \
                and action.option_strings:
            return f"{text} (default: %(default)s)"
        return text


def description(doc: str | None) -> str | None:
    """A module docstring as a command's description: without its first paragraph (the one-line help), without
    reST markup (``x`` reads x), each paragraph wrapped to the terminal (at most 100 columns); an indented block (a
    command to copy) is kept as written."""
    if not doc or "\n\n" not in doc:
        return None
    width = min(100, shutil.get_terminal_size().columns) - 2  # as argparse wraps the options
    paragraphs = []
    for para in doc.split("\n\n")[1:]:
        para = para.strip("\n").replace("``", "")
        if para.startswith("    "):
            paragraphs.append(textwrap.dedent(para))
        else:
            paragraphs.append(textwrap.fill(" ".join(para.split()), width))
    return "\n\n".join(p for p in paragraphs if p.strip())


def add_command(sub: Any, name: str, run: Callable[[argparse.Namespace], int], *, doc: str | None, help: str,
                epilog: str) -> argparse.ArgumentParser:
    """The sub-command ``name``: its description is its module's docstring after the first paragraph
    (:func:`description`), and its epilog (examples) keeps its line breaks."""
    p = sub.add_parser(name, help=help, description=description(doc), epilog=epilog, formatter_class=HelpFormatter)
    p.set_defaults(func=run, command_name=name)
    return p


def log_lines(run: Callable[[], int], prefix: str = "slurmrt run") -> int:
    """slurmrt's own warnings while ``run`` runs (the recovery plan's, the exclusion's) written as the command's own
    lines are, on stderr after ``prefix``, not bare through Python's fallback handler. The library configures no
    logging; a command is a program of its own, and undoes it after."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("slurmrt")
    logger.addHandler(handler)
    try:
        return run()
    finally:
        logger.removeHandler(handler)
