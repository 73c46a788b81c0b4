"""Where ``slurmrt run`` places a training step in the job's allocation, and the ``srun`` line that starts it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..launch.slurmvars import submit_dir

__all__ = ["STEP_WAIT_S", "Placement", "default_directory", "place", "srun_command",
           "under_batch_shell"]


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]
    spares: tuple[str, ...]


def place(allocation: Sequence[str], excluded: Sequence[str], wanted: int, *,
          avoid: Sequence[str] = ()) -> Placement | None:
    """The step's ``wanted`` nodes, in the allocation's order, and the spares left; None when too few remain. Nodes
    to ``avoid`` (the user's bad-node ledger) come last: the step gets them only when nothing else is left."""
    usable = [n for n in allocation if n not in set(excluded)]
    usable = [n for n in usable if n not in set(avoid)] + [n for n in usable if n in set(avoid)]
    if len(usable) < wanted:
        return None
    return Placement(tuple(usable[:wanted]), tuple(usable[wanted:]))


#: ``srun --wait``: the step's tasks still running this long after one ended are ended. The ranks end together (they
#: agree on the end first), so a task still there minutes later is frozen: the cluster campaign's rank 0, stopped
#: after it had finished, kept its job for ever.
STEP_WAIT_S = 120


def srun_command(srun: str, placement: Placement, per_node: int, extra: Sequence[str],
                 command: Sequence[str], *, wait_s: int = STEP_WAIT_S) -> list[str]:
    n = len(placement.nodes)
    return [srun, "--kill-on-bad-exit=1", *([f"--wait={wait_s}"] if wait_s > 0 else []), f"--nodes={n}",
            f"--nodelist={','.join(placement.nodes)}", f"--ntasks={n * per_node}", f"--ntasks-per-node={per_node}",
            *extra, *command]


def step_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def under_batch_shell(pid: int) -> bool:
    """``pid`` runs Slurm's copy of the batch script (``.../job<id>/slurm_script``): a shell that a ``B:`` signal
    reaches instead of its children."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"/slurm_script") for a in argv[:3])


def default_directory(env: Mapping[str, str], job: str) -> Path:
    """``.slurmrt-run-<job>`` in the submit directory, which every node of a cluster sees (Slurm writes the job's
    output there)."""
    base = submit_dir(env) or os.getcwd()
    return Path(base).resolve() / f".slurmrt-run-{job}"
