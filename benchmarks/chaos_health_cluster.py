"""The campaign of training-health faults (:mod:`benchmarks.chaos_health`) on the test cluster: the same trials drawn
from the same seeds, each one a real sbatch job instead of a ``slurmrt sim`` one.

    tests/slurm/cluster.sh start
    python -m benchmarks.chaos_health_cluster --seeds 5 --trials 4 --clean 1

Each job takes 3 nodes with one task on each (``--requeue``), and runs the in-process restart's worker under
``srun --kill-on-bad-exit=1``, with each node's local tier in a directory of its own, as
``tests/slurm/test_inprocess.py`` runs it. No simulator is there to make the fault, so the worker makes it (its
``--nan``, ``--spike``, ``--flip``), in the job's first run only: at the drawn step of the drawn rank, once (a NaN,
a flipped bit) or each time the step is reached (a NaN that comes back, a spike). A transient fault's node goes into
the job's ``ExcNodeList``, and Slurm places the requeued run on the cluster's fourth node. Every job is judged as the
simulator's are (found at its step, no tainted resume, the weights bit for bit against an uninterrupted job that
skipped the same batches). The jobs run one at a time: three of the cluster's four nodes each.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tests.slurm.conftest import submit
from tests.slurm.test_inprocess import train_line

from . import chaos_health
from .chaos_health import ENV, TASKS, Trial


def cluster_job(directory: Path, trial: Trial | None, steps: int, worker_args: Sequence[str] = ()) -> tuple[int, str]:
    """One trial as an sbatch job; 0 when it ended COMPLETED, and its output's tail."""
    args = [*(trial.worker_args() if trial is not None else []), *worker_args]
    # Double quotes: the line is inside bash -c '...', where shlex's single quotes would end the command's own (a
    # NaN each time is "*:R:S", which neither shell may expand as a file name).
    line = train_line(" ".join(f'"{a}"' for a in args), steps=steps, options="--replicas",
                      out=f'"{directory / "out"}"')
    body = f"export PY\nsrun --kill-on-bad-exit=1 {line}\nexit $?"
    bin_dir = Path(sys.executable).parent
    job = submit(directory, body, f"-N{TASKS}", "--ntasks-per-node=1", "--requeue", name=directory.name,
                 exports={**ENV, "PATH": f"{bin_dir}:/usr/bin:/bin",
                          "SLURMRT_NODE_LEDGER": str(directory / "bad-nodes.json")})
    try:
        info = job.wait(900)
    finally:
        job.cancel_unfinished()
    state = info.get("JobState")
    return (0 if state == "COMPLETED" else 1), f"job {job.id} {state}\n{job.output()[-3000:]}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return chaos_health.main([*argv, "--jobs", "1"], run=cluster_job, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
