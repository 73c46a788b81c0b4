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


def run(args: argparse.Namespace) -> int:
    root: Path = args.dir
    one = os.path.lexists(root / MANIFEST)  # whatever it is: a FIFO or a link there is named below, not skipped
    targets = [root] if one else [root / f"step_{s:09d}" for s in step_dirs(root)]
    if not targets:
        raise SlurmrtError(f"{root} holds no committed checkpoint (no {MANIFEST} in it or in a step_N under it)")
    bad = 0
    for path in targets:
        problems = verify(path)
        if problems and not one and not os.path.lexists(path):
            print(f"{path}: gone (pruned by the job while this ran)")  # a job with keep_last prunes as it saves
            continue
        if problems:
            bad += 1
            print(f"{path}: DAMAGED")
            for p in problems:
                print(f"  {p}")
        else:
            print(f"{path}: ok")
    return 1 if bad else 0


def add_parser(sub: Any) -> None:
    p = add_command(sub, "verify", run, doc=__doc__, help="check checkpoints' files against their manifests",
                    epilog="example: slurmrt verify /shared/ckpt/run17")
    p.add_argument("dir", type=Path, metavar="DIR")
