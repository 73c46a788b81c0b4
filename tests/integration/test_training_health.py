"""The training's health (``rt.check``) with real processes and gloo, in the in-process restart's worker: a NaN on
one rank stops every rank at that step before its update; once (transient) the run is rewound to its newest
checkpoint in the same processes and ends bitwise where an uninterrupted run does; at the same step again
(reproducible) it ends, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_inprocess import N, _events, _logs, _run  # the same worker, run the same way

pytestmark = pytest.mark.timeout(240)


def test_a_nan_on_one_rank_is_rewound_once_and_the_run_ends_bitwise_equal(tmp_path: Path) -> None:
    import torch

    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean) == [0] * N, _logs(clean)
    assert _run(faulted, "--nan", "0:1:7") == [0] * N, _logs(faulted)
    (health,) = _events(faulted, "training_health")
    assert (health["step"], health["what"], health["first_rank"]) == (7, "nonfinite", 1)
    (restart,) = _events(faulted, "in_process")
    assert restart["action"] == "restart" and "TrainingHealthError" in restart["error"]
    generations = json.loads((faulted / "out" / "generations.json").read_text())
    assert [g["resumed"] for g in generations] == [None, 6]  # rewound to the local tier's newest, before step 7
    assert "rank 1, step 7: loss is nan" in (faulted / "rank1.log").read_text()
    a, b = torch.load(clean / "out" / "weights.pt"), torch.load(faulted / "out" / "weights.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the NaN never reached the weights


def test_a_nan_that_comes_back_at_the_same_step_ends_the_run_on_every_rank(tmp_path: Path) -> None:
    codes = _run(tmp_path, "--nan", "*:1:7")
    assert len(set(codes)) == 1 and codes[0] != 0, _logs(tmp_path)
    assert [(e["step"], e["first_rank"]) for e in _events(tmp_path, "training_health")] == [(7, 1), (7, 1)]
    made, refused = _events(tmp_path, "in_process")
    assert made["action"] == "restart" and refused["action"] == "refused" and "repeats" in refused["why"]
    assert not (tmp_path / "out" / "weights.pt").exists()
