"""Real processes in each launch shape: the topology they derive lets gloo rendezvous and all_reduce."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .launch import ROOT, start, wait_all

pytestmark = pytest.mark.timeout(180)
QUICKSTART = ROOT / "examples" / "quickstart" / "train.py"


def test_srun_shaped_step_of_four_tasks_rendezvous_and_all_reduce(tmp_path: Path) -> None:
    procs = start(4, tmp_path, ["--steps", "5"], script=QUICKSTART)
    assert wait_all(procs, timeout=150) == [0] * 4
    out = "".join((tmp_path / f"rank{r}.log").read_text() for r in range(4))
    for r in range(4):
        assert f"rank {r}/4 local {r}/4 node 0/1 master localhost:" in out
    assert "finished 5 steps" in out


def test_torchrun_on_a_workstation_without_slurm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = str(ROOT / "src")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(QUICKSTART),
                          "--steps", "5"], env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 1/2 local 1/2 node 0/1" in out.stdout and "finished 5 steps" in out.stdout


def test_no_slurm_no_launcher_runs_as_one_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    out = subprocess.run([sys.executable, str(QUICKSTART), "--steps", "3"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "rank 0/1 local 0/1 node 0/1" in out.stdout


def test_batch_shell_without_srun_warns_that_other_tasks_never_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
                "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1"})
    code = "import logging, slurmrt; logging.basicConfig(); rt = slurmrt.init(); print(rt.world_size)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1"
    assert "the other 3 tasks will never start" in out.stderr


def test_nnodes_mismatch_fails_every_rank_within_seconds_before_any_rendezvous(tmp_path: Path) -> None:
    began = time.monotonic()
    procs = start(4, tmp_path, ["--steps", "5"], script=QUICKSTART, extra={"NNODES": "2"})
    codes = wait_all(procs, timeout=120)
    assert codes == [1] * 4
    assert time.monotonic() - began < 60  # seconds of imports on a loaded 2-core machine, not a rendezvous timeout
    for r in range(4):
        assert "NodeCountError: NNODES=2 but this step runs on 1 nodes" in (tmp_path / f"rank{r}.log").read_text()
