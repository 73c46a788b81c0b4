"""13. What slurmrt costs the cluster as the job grows: counts, not times, so that a 2-core machine measures them
honestly.

A job of N ranks (4 per node) under ``slurmrt sim``: init, a resume, 60 steps, three saves (``_cost_worker.py``).
Counted: every Slurm command the job's processes run (each shim wrapped by one that logs its calls: the controller's
load), the files of a checkpoint and of the checkpoint directory, the event log's bytes (the same run at every size),
and the threads and sockets slurmrt adds to each process (after its saves, less what the program's own process group
holds). The line
to 16,384 ranks: the Slurm commands and the files of a checkpoint by design (one asker; a part per rank), the sockets
and threads on the line through the smallest and the largest job measured, in log2 of the ranks.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import HERE, ROOT, Section, table

WORKER = HERE / "_cost_worker.py"
#: srun is not wrapped: the wrapper's PATH, without itself, would reach the tasks (and the step's srun is the script's).
COMMANDS = ("squeue", "scontrol", "scancel", "sbatch", "sinfo")
PER_NODE = 4
STEPS = 60


def _job(ranks: int, tmp: Path) -> dict[str, Any]:
    log = tmp / "commands.log"
    wrap = tmp / "bin"
    wrap.mkdir()
    for name in COMMANDS:  # logs the call, then runs the simulator's own (next on PATH after this directory)
        (wrap / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nPATH=$(echo "$PATH" | cut -d: -f2-) '
                                 f'exec {name} "$@"\n')
        (wrap / name).chmod(0o755)
    ckpt = tmp / "ckpt"
    batch = tmp / "job.sbatch"
    batch.write_text(f"#!/bin/bash\n#SBATCH -N {ranks // PER_NODE} --ntasks-per-node={PER_NODE} --time=30\n"
                     f"export PATH={wrap}:$PATH SLURMRT_CHECKPOINT_DIR={ckpt} OMP_NUM_THREADS=1\n"
                     f"srun {sys.executable} {WORKER} {tmp / 'out'} {STEPS}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "SLURMRT_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "slurmrt", "sim", str(batch)], env=env, capture_output=True, timeout=1800,
                   check=True)
    wall = time.perf_counter() - started
    calls = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    held = [json.loads(p.read_text()) for p in sorted((tmp / "out").glob("rank*.json"))]
    steps = sorted(ckpt.glob("step_*"))
    return {"ranks": ranks, "wall_s": wall, "calls": {c: calls.count(c) for c in COMMANDS if calls.count(c)},
            "checkpoint_files": sum(1 for p in steps[-1].rglob("*") if p.is_file()) if steps else 0,
            "directory_files": sum(1 for p in ckpt.rglob("*") if p.is_file()),
            "event_bytes": sum(p.stat().st_size for p in ckpt.glob("events-*.jsonl")),
            "threads": max(h["threads"] for h in held), "sockets": max(h["sockets"] for h in held),
            "reported": len(held), "end_known": all(h["end_time"] for h in held)}


def _per_doubling(rows: list[list[Any]], column: int, ranks: int) -> float:
    """Column ``column`` at ``ranks``, on the line through the smallest and the largest job measured in log2 of the
    ranks: what a tree of log2(N) partners grows like (flat when it is)."""
    (n1, y1), (n2, y2) = [(rows[i][0], float(rows[i][column])) for i in (0, -1)]
    slope = (y2 - y1) / math.log2(n2 / n1)
    return y2 + slope * math.log2(ranks / n2)


def run(*, quick: bool = False) -> Section:
    sizes = (8, 16) if quick else (8, 16, 32)
    rows, figures = [], {}
    for ranks in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            got = _job(ranks, Path(tmp))
        assert got["reported"] == ranks, got
        asked = sum(got["calls"].values())
        rows.append([ranks, ranks // PER_NODE, ", ".join(f"{c} {n}" for c, n in got["calls"].items()) or "none",
                     f"{got['wall_s']:.0f}", got["checkpoint_files"], got["directory_files"],
                     got["event_bytes"], f"{got['event_bytes'] / ranks:.0f}", got["threads"], got["sockets"]])
        figures[f"slurm_commands_{ranks}"] = asked
        figures[f"sockets_{ranks}"] = got["sockets"]
        figures[f"threads_{ranks}"] = got["threads"]
    measured = table(["ranks", "nodes", "Slurm commands slurmrt ran (all processes)", "job's wall s",
                      "files of one checkpoint", "files in the checkpoint directory", "event log bytes",
                      "event log bytes per rank",
                      "threads slurmrt adds (most of any process)", "sockets slurmrt adds (most)"], rows)
    model = table(["ranks", "Slurm commands per job-hour", "files of one checkpoint", "sockets slurmrt adds",
                   "threads slurmrt adds"],
                  [[n, "1 squeue at the start, then 4 (every end_time_refresh_s, 900 s), from one process: flat",
                    f"{n + 1} (a part per rank, the manifest)", f"{_per_doubling(rows, 9, n):.0f}",
                    f"{_per_doubling(rows, 8, n):.0f}"] for n in (1024, 16384)])
    body = (f"Each job: N ranks, {PER_NODE} per node, under `slurmrt sim`; init, a resume, {STEPS} steps of 50 ms, "
            "three saves.\n\n" + measured + "\n\n" + model + "\n\n"
            "The controller's load: the Slurm commands a job runs do not grow with its ranks (only rank 0 asks "
            "squeue for the end time; under `slurmrt run` the supervisor asks and the ranks read its word). The "
            "shared filesystem: a checkpoint is a part per rank and a manifest (plus, once per run, a token per "
            "node for the directory survey); rank 0 stats each part once before the commit. Sockets: two trees, "
            "log2(N) partners each, and a listener; the threads grow as the sockets do, two per doubling of the "
            "ranks. The event log: rank 0 writes the run's record (init, progress, saves, the "
            "decisions, the exit); another rank writes only what is its own (a signal it received, its hang), so "
            "the log grows far slower than the ranks.")
    return Section("What a job costs the cluster as it grows", body, figures)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv).body)
