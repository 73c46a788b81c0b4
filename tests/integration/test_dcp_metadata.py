"""DCP's replicas picked the same way on every rank, whatever the interpreter's hash seed."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import (
    MetadataIndex,
)

NAMES = [f"model.layers.{i}.{part}" for i in range(16) for part in ("weight", "bias", "norm.weight")]


def test_every_rank_picks_the_same_holder_for_an_item_whatever_its_hash_seed() -> None:
    import json
    import os
    import subprocess
    import sys

    from slurmrt.checkpoint.sharded import holder

    here = [holder(MetadataIndex(n, torch.Size([8, 0])), 4) for n in NAMES]
    code = ("import json, sys, torch; from torch.distributed.checkpoint.metadata import MetadataIndex; "
            "from slurmrt.checkpoint.sharded import holder; "
            "print(json.dumps([holder(MetadataIndex(n, torch.Size([8, 0])), 4) for n in json.loads(sys.argv[1])]))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, json.dumps(NAMES)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here, f"PYTHONHASHSEED={seed}"
