"""6. Start-up: `import slurmrt` and `slurmrt.init()` with and without torch already imported, and the number of
scheduler queries a 4-task job makes (counted by a squeue on PATH that logs its calls)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import ROOT, Section, table

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
if sys.argv[1] == "torch":
    import torch
t1 = time.perf_counter()
import slurmrt
t2 = time.perf_counter()
rt = slurmrt.init()
t3 = time.perf_counter()
rt.close()
print(json.dumps({"torch": t1 - t0, "import": t2 - t1, "init": t3 - t2}))
"""


def run(quick: bool = False) -> Section:
    repeats = 5 if quick else 15
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    rows = []
    figures: dict[str, object] = {}
    baseline = statistics.median(
        _time([sys.executable, "-c", "pass"], env) for _ in range(repeats))
    for mode in ("plain", "torch"):
        samples = [json.loads(subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                                             text=True, check=True).stdout) for _ in range(repeats)]
        imp = statistics.median(s["import"] for s in samples) * 1000
        init = statistics.median(s["init"] for s in samples) * 1000
        torch_ms = statistics.median(s["torch"] for s in samples) * 1000
        figures[mode] = {"import_ms": imp, "init_ms": init, "torch_ms": torch_ms}
        rows.append([f"{'after `import torch`' if mode == 'torch' else 'without torch'}", f"{imp:.1f}", f"{init:.1f}",
                     f"{torch_ms:.0f}" if mode == "torch" else "-"])
    queries = _scheduler_queries()
    figures["squeue_calls_per_job"] = queries
    body = table(["", "import slurmrt, ms", "slurmrt.init(), ms", "import torch, ms (comparator)"], rows)
    body += (f"\n\nMedians of {repeats} fresh interpreters (an empty interpreter starts in {baseline * 1000:.0f} ms). "
             f"Scheduler queries in a 4-task job under `slurmrt sim`, end time unknown to the tasks: **{queries}** "
             "(target: at most one, from one process).")
    return Section("Start-up and scheduler queries", body, figures)


def _time(cmd: list[str], env: dict[str, str]) -> float:
    import time

    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - t0


def _scheduler_queries() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "squeue.log"
        fake = Path(tmp) / "bin"
        fake.mkdir()
        # Counts calls, then defers to the simulator's own squeue (next on PATH after this directory).
        (fake / "squeue").write_text(f'#!/bin/sh\necho "$@" >> {log}\nPATH=$(echo "$PATH" | cut -d: -f2-) '
                                     'exec squeue "$@"\n')
        (fake / "squeue").chmod(0o755)
        script = Path(tmp) / "job.py"
        # Four processes: should_stop agrees through torch.distributed, which must be initialized.
        script.write_text("import time, slurmrt\nrt = slurmrt.init()\nimport torch.distributed as dist\n"
                          "dist.init_process_group('gloo')\nfor s in range(30):\n    time.sleep(0.1)\n"
                          "    rt.should_stop(s)\nrt.close()\ndist.destroy_process_group()\n")
        batch = Path(tmp) / "job.sbatch"
        batch.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=2 --time=10\nexport PATH={fake}:$PATH\n"
                         f"srun {sys.executable} {script}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        env["PYTHONPATH"] = str(ROOT / "src")
        subprocess.run([sys.executable, "-m", "slurmrt", "sim", str(batch)], env=env, capture_output=True,
                       timeout=300, check=True)
        return len(log.read_text().splitlines()) if log.exists() else 0
