"""Sharded checkpoints (DCP) with real processes and gloo: an FSDP2 model and a tensor-parallel one, saved by 4 ranks
and resumed by 2 and by 4 (and saved by 2, resumed by 4), parameters and optimizer state bitwise equal to the values
at the save; plain ``dcp.load`` reads the checkpoint without slurmrt; rank-local state comes back on the same world
size and is reported lost on another."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration import launch
from tests.integration.conftest import read_results

WORKER = Path(__file__).with_name("sharded_worker.py")


def run(n: int, out: Path, ckpt: Path, *args: str) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    procs = launch.start(n, out, ["--out", str(out), *args], script=WORKER,
                         extra={"SLURMRT_CHECKPOINT_DIR": str(ckpt)})
    codes = launch.wait_all(procs, 600)
    logs = "\n".join((out / f"rank{r}.log").read_text()[-3000:] for r in range(n))
    assert codes == [0] * n, logs
    return read_results(out, n)


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("mode", ["fsdp", "tp"])
def test_saved_by_4_ranks_resumed_by_2_and_by_4_with_the_saved_parameters_and_optimizer_state(
        mode: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    run(4, tmp_path / "save4", ckpt, "--mode", mode, "--steps", "10")
    saved = torch.load(tmp_path / "save4" / "state.pt")["at_save"]
    assert saved["step"] == 9 and saved["optim"]["state"], "Adam's state is part of the checkpoint"
    for n in (2, 4):
        copy = tmp_path / f"ckpt{n}"
        shutil.copytree(ckpt, copy)
        ranks = run(n, tmp_path / f"resume{n}", copy, "--mode", mode, "--steps", "15")
        assert [r["start"] for r in ranks] == [10] * n
        resumed = torch.load(tmp_path / f"resume{n}" / "state.pt")["resumed"]
        assert_same(resumed, {"model": saved["model"], "optim": saved["optim"]}, f"resumed on {n}")
        if n == 4:
            assert [r["local_state"] for r in ranks] == [{"rank": r} for r in range(4)]
        else:  # another world size: the rank-local state is not restored, and each rank's log says so
            assert [r["local_state"] for r in ranks] == [None] * n
            assert "saved by 4 ranks and this run has 2: it is not restored" in \
                (tmp_path / "resume2" / "rank1.log").read_text()
    # Interrupted at step 9 and resumed on the same 4 ranks: bitwise the run that never stopped.
    run(4, tmp_path / "straight", tmp_path / "ckpt-straight", "--mode", mode, "--steps", "15", "--save-every", "0")
    straight = torch.load(tmp_path / "straight" / "state.pt")["final"]
    assert_same(torch.load(tmp_path / "resume4" / "state.pt")["final"], straight, "resumed vs uninterrupted")


def test_saved_by_2_ranks_resumed_by_4_and_read_by_plain_dcp(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    run(2, tmp_path / "save2", ckpt, "--mode", "fsdp", "--steps", "5", "--background")
    saved = torch.load(tmp_path / "save2" / "state.pt")["at_save"]
    run(4, tmp_path / "resume4", ckpt, "--mode", "fsdp", "--steps", "5")
    assert_same(torch.load(tmp_path / "resume4" / "state.pt")["resumed"],
                {"model": saved["model"], "optim": saved["optim"]}, "resumed on 4")
    # No lock-in: the committed directory is a DCP checkpoint that torch reads without slurmrt (one process).
    import torch.distributed.checkpoint as dcp

    model = {k: torch.empty_like(v) for k, v in saved["model"].items()}
    dcp.load({"model": model}, checkpoint_id=str(ckpt / "step_000000004"))
    assert_same(model, saved["model"], "plain dcp.load")
