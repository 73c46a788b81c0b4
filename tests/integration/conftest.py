from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


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
