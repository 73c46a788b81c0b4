"""``--json``: what a command found, as one JSON document on stdout, for scripts and dashboards.

Every document carries ``schema`` ("slurmrt.<command>/<version>") and ``slurmrt`` (the version that wrote it). A
version changes only when a key is removed or changes meaning; new keys may appear in any version. The keys of each
command are in docs/reference/cli.md. The exit code is the command's usual one.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._figures import finite_json

#: The version of every command's document (one number for all: they change together, rarely).
SCHEMA_VERSION = 1


def add_flag(p: argparse.ArgumentParser) -> None:
    schema = f"slurmrt.{p.prog.split()[-1]}/{SCHEMA_VERSION}"
    p.add_argument("--json", action="store_true", help=f"print one JSON document (schema {schema}) instead of text")


def emit(command: str, payload: dict[str, Any]) -> None:
    from .. import __version__

    document = finite_json({"schema": f"slurmrt.{command}/{SCHEMA_VERSION}", "slurmrt": __version__, **payload})
    print(json.dumps(document, indent=1, default=str, allow_nan=False))  # RFC 8259: no NaN, no Infinity
