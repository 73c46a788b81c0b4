"""Every example has an sbatch file, and they all end the same way (issue 39): slurmrt's own exit codes, 1 (a
software error, which fails again) among them, are never requeued by the script, and a checkpoint directory is one
per job name and shape, so that a run at another shape never resumes from a foreign checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmrt import ExitCode
from tests.integration.launch import ROOT

SBATCH = sorted((ROOT / "examples").glob("*/*.sbatch"))


def test_every_example_directory_has_an_sbatch_file() -> None:
    directories = sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert [d.name for d in directories if not list(d.glob("*.sbatch"))] == []


@pytest.mark.parametrize("path", SBATCH, ids=[str(p.relative_to(ROOT)) for p in SBATCH])
def test_the_script_never_requeues_slurmrts_own_codes_nor_a_software_error(path: Path) -> None:
    text = path.read_text()
    if re.search(r"^exec slurmrt run\b", text, re.M):
        return  # slurmrt run decides and requeues itself; the script ends with it
    tail = re.search(r"case \$rc in ([0-9|]+)\)", text)
    assert tail is not None, f"{path.name}: no `case $rc in ...)` tail after srun"
    answered = {str(int(code)) for code in ExitCode if code is not ExitCode.REQUEUE_NEEDED}  # 75 asks the script
    assert set(tail[1].split("|")) >= {"1", "2"} | answered, tail[0]
    assert "75" not in tail[1].split("|"), tail[0]
    assert re.search(r"SLURM_RESTART_COUNT:-0\}\" -lt \d+", text), "a bounded number of requeues for a crash"


@pytest.mark.parametrize("path", SBATCH, ids=[str(p.relative_to(ROOT)) for p in SBATCH])
def test_a_checkpoint_directory_is_one_per_job_name_and_shape(path: Path) -> None:
    for line in re.findall(r".*ckpt-\$SLURM_JOB_NAME.*", path.read_text()):
        assert "SLURM_NTASKS" in line, line
