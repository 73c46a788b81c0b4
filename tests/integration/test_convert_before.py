"""The "before" scripts of docs/guides/convert.md run as their users launch them (outside Slurm, two processes): a
page that converts a script must start from one that works. Each runs twice in one directory: a fresh start, then
the resume from what the first run saved."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import ROOT

pytestmark = pytest.mark.timeout(900)

CONVERT = ROOT / "examples" / "convert"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(name: str) -> list[str]:
    """The launcher each script's docstring names, with two processes on this machine's CPU."""
    script = str(CONVERT / f"{name}_before.py")
    if name in ("ddp", "trainer"):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(_port()), script]
    if name == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                "--main_process_port", str(_port()), script]
    return [sys.executable, script]  # Lightning starts its own processes (devices=2)


@pytest.mark.parametrize("name", ["ddp", "trainer", "lightning", "accelerate"])
def test_a_before_script_runs_fresh_and_resumes(name: str, tmp_path: Path) -> None:
    if name in ("trainer", "accelerate", "lightning"):
        pytest.importorskip({"trainer": "transformers", "accelerate": "accelerate", "lightning": "lightning"}[name])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    for attempt in ("fresh", "resumed"):
        out = subprocess.run(_launch(name), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert out.returncode == 0, f"{name}_before.py, {attempt} run:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert any(tmp_path.iterdir()), f"{name}_before.py saved nothing"
