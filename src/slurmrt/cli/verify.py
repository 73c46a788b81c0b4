"""``slurmrt verify``: check checkpoints against their manifests, every file's size and checksum (XXH3-64).

DIR is one checkpoint (``step_N``, with its ``manifest.json``) or a checkpoint directory, whose checkpoints are all
checked, newest first (a ``step_N`` without a manifest is damage: it was committed with one). Exit 0 when every one
checked is sound, 1 when one is not (each problem names the file), 2 when DIR holds no checkpoint.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from ..checkpoint.manifest import MANIFEST, step_dirs, verify
from ._common import add_command
from ._json import add_flag, emit


def run(args: argparse.Namespace) -> int:
    root: Path = args.dir
    one = os.path.lexists(root / MANIFEST)  # whatever it is: a FIFO or a link there is named below, not skipped
    targets = [root] if one else [root / f"step_{s:09d}" for s in step_dirs(root)]
    if not targets:
        raise SlurmrtError(f"{root} holds no committed checkpoint (no {MANIFEST} in it or in a step_N under it)")
    found = [_check(path, one) for path in targets]
    bad = sum(1 for f in found if f["status"] == "damaged")
    if args.json:
        emit("verify", {"dir": str(root), "ok": not bad, "checkpoints": found})
    else:
        _print(found)
    return 1 if bad else 0


def _print(found: list[dict[str, Any]]) -> None:
    for f in found:
        if f["status"] == "gone":
            print(f"{f['path']}: gone (pruned by the job while this ran)")  # a job with keep_last prunes as it saves
        elif f["status"] == "damaged":
            print(f"{f['path']}: DAMAGED")
            for p in f["problems"]:
                print(f"  {p}")
        else:
            print(f"{f['path']}: ok")


def _check(path: Path, one: bool) -> dict[str, Any]:
    """One checkpoint: ``status`` "ok", "damaged" (with its ``problems``, each naming a file) or "gone" (pruned
    while this ran)."""
    problems = verify(path)
    if problems and not one and not os.path.lexists(path):
        return {"path": str(path), "status": "gone", "problems": []}
    return {"path": str(path), "status": "damaged" if problems else "ok", "problems": list(problems)}


def add_parser(sub: Any) -> None:
    p = add_command(sub, "verify", run, doc=__doc__, help="check checkpoints' files against their manifests",
                    epilog="example: slurmrt verify /shared/ckpt/run17")
    p.add_argument("dir", type=Path, metavar="DIR", help="a checkpoint (step_N) or a checkpoint directory")
    add_flag(p)
