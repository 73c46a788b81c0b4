from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The commands by which slurmrt asks Slurm about jobs. This machine may run a Slurm of its own (tests/slurm's
#: cluster, or a real one); a test that did not mean to ask it must not get its answers ("Invalid job id" for a
#: job it never knew), so these stand first on every test's PATH and answer that no Slurm is here.
_SLURM_QUERIES = ("squeue", "scontrol", "sacct", "sinfo", "scancel", "sbatch")


def read_results(out: Path, n: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def expected_weights(steps: int, world: int) -> list[float]:
    """The worker's final weights after an uninterrupted run of ``steps`` steps on ``world`` ranks."""
    import torch

    w = torch.zeros(8)
    for step in range(steps):
        grad = sum(torch.randn(8, generator=torch.Generator().manual_seed(step * 1000 + r)) for r in range(world))
        w -= 0.01 * grad
    return w.tolist()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(autouse=True)
def _no_real_slurm(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every integration test runs with stubs of Slurm's commands first on PATH (a test that builds its own PATH
    from scratch, or puts its own fakes first, decides for itself). A test that means to ask a real Slurm uses
    tests/slurm."""
    stubs = tmp_path_factory.getbasetemp() / "no-slurm-bin"
    if not stubs.is_dir():
        stubs.mkdir(exist_ok=True)
        for name in _SLURM_QUERIES:
            stub = stubs / name
            stub.write_text(f"#!/bin/sh\necho \"{name}: no Slurm in this test (tests/integration/conftest.py)\" >&2\n"
                            "exit 1\n")
            stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}")
    yield
