"""``python -m slurmrt.recovery.probe [CHECKPOINT_DIR]``: the node health check that ``slurmrt run`` runs on a
suspect node after a fault, from outside the failed processes (``srun --overlap``, one task per node). Prints one
JSON line, ``{"node": ..., "failures": [...]}`` (empty: healthy): :func:`slurmrt.launch.health.check_node`'s
checks (``/dev/shm`` and the checkpoint directory writable, the GPUs that Slurm gave the job answer NVML with their
memory free: a leftover process of the failed step that still holds one is a finding).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..launch.health import check_node
from ..launch.slurmvars import gpus_on_node, this_node

#: The step has just ended: its processes' GPU memory may take this long to be given back.
SETTLE_S = 10.0


def main(argv: list[str]) -> int:
    node = this_node(os.environ)
    gpus = gpus_on_node(os.environ) or 0
    try:
        failures = check_node(os.environ, checkpoint_dir=Path(argv[0]) if argv else None, gpus=gpus, local_rank=0,
                              settle_s=SETTLE_S)
    except Exception as err:  # noqa: BLE001 - a check that cannot run is a finding about the node
        failures = [f"the health check raised {type(err).__name__}: {err}"]
    print(json.dumps({"node": node, "failures": failures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
