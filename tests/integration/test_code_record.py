"""What ran, recorded for real: a training in a git repository runs, is "requeued" after its script was edited and
committed, and `slurmrt status` says so on the second run's line; the init event holds the commit and the dirty
flag git gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import ROOT

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

SCRIPT = """
import slurmrt
rt = slurmrt.init(deadline=False)
got = rt.load_latest()
start = got[0] + 1 if got else 0
for step in range(start, start + 3):
    rt.should_stop(step)
rt.save({"w": step}, step=step)
rt.finish()
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


def _run(repo: Path, ckpt: Path, restart: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": str(restart), "SLURMRT_CHECKPOINT_DIR": str(ckpt),
                "SLURMRT_REQUEUE": "0", "PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    done = subprocess.run([sys.executable, str(repo / "train.py"), "--lr", "0.1"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_requeued_run_on_an_edited_script_is_said_by_status(tmp_path: Path) -> None:
    repo, ckpt = tmp_path / "repo", tmp_path / "ckpt"
    repo.mkdir()
    (repo / "train.py").write_text(SCRIPT)
    _git(repo, "init", "-q")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-qm", "first")
    _run(repo, ckpt, 0)
    (repo / "train.py").write_text(SCRIPT + "# a change\n")  # edited and not committed: dirty
    _run(repo, ckpt, 1)
    inits = [json.loads(line) for line in (ckpt / "events-4711.jsonl").read_text().splitlines()
             if '"init"' in line]
    first, second = (e["ran"] for e in inits)
    assert first["git"]["dirty"] is False and second["git"]["dirty"] is True
    assert first["git"]["commit"] == second["git"]["commit"] and len(first["git"]["commit"]) == 40
    assert first["script"] == str(repo / "train.py") and first["argv"][1:] == ["--lr", "0.1"]
    assert first["sha256"] != second["sha256"]
    out = subprocess.run([sys.executable, "-m", "slurmrt", "status", str(ckpt), "--no-chart"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120).stdout
    (line,) = [x for x in out.splitlines() if x.strip().startswith("run 1:")]
    assert f"code changed since run 0: train.py edited ({first['sha256']} -> {second['sha256']})" in line, out
    assert "(dirty)" in line, out
    assert "code changed" not in [x for x in out.splitlines() if x.strip().startswith("run 0:")][0]
