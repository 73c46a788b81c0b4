"""The in-process restart (``slurmrt.run_restartable``) with real processes and gloo: a rank that raises is restarted in
the same processes and the training ends bitwise where an uninterrupted one does; an error that repeats, or a rank
whose process died, is not waited for; a stop after the restart is still agreed by every rank."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .launch import ROOT, start, wait_all

pytestmark = pytest.mark.timeout(240)

N = 3
WORKER = ROOT / "tests" / "integration" / "inprocess_worker.py"


def _run(tmp: Path, *args: str, timeout: float = 180, env: dict[str, str] | None = None) -> list[int]:
    return wait_all(_start(tmp, *args, env=env), timeout)


def _start(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    (tmp / "local").mkdir(parents=True, exist_ok=True)
    extra = {"SLURMRT_CHECKPOINT_DIR": str(tmp / "ckpt"), "SLURMRT_LOCAL_CHECKPOINT_DIR": str(tmp / "local"),
             "SLURMRT_SAVE_TIME_S": "1", **(env or {})}
    return start(N, tmp, ["--out", str(tmp / "out"), *args], extra=extra, script=WORKER)


def _weights(tmp: Path) -> dict[str, Any]:
    import torch

    return dict(torch.load(tmp / "out" / "weights.pt"))


def _events(tmp: Path, kind: str) -> list[dict[str, Any]]:
    lines = (tmp / "ckpt" / "events-4242.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def _logs(tmp: Path) -> str:
    return "\n".join((tmp / f"rank{r}.log").read_text() for r in range(N))


def test_a_rank_that_raises_is_restarted_in_the_same_processes_and_ends_bitwise_equal(tmp_path: Path) -> None:
    import torch

    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean) == [0] * N, _logs(clean)
    assert _run(faulted, "--fail", "0:1:7") == [0] * N, _logs(faulted)

    generations = json.loads((faulted / "out" / "generations.json").read_text())
    assert [g["generation"] for g in generations] == [0, 1]
    assert generations[0]["pid"] == generations[1]["pid"]  # the same process: no new step, no requeue
    assert generations[1]["resumed"] == 6  # the local tier's newest: saved every step, the fault after step 7's update
    [restart] = _events(faulted, "in_process")
    assert (restart["action"], restart["first_rank"], restart["generation"]) == ("restart", 1, 0)
    assert "injected fault at step 7" in restart["error"]
    a, b = _weights(clean), _weights(faulted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (faulted / "slurm-calls.log").exists() or "requeue" not in (faulted / "slurm-calls.log").read_text()


def test_should_save_after_a_restart_asks_every_rank_at_the_same_step(tmp_path: Path) -> None:
    """``rt.should_save`` counts its steps on each rank, and the ranks left generation 0 at different steps: rank 1
    raised after step 7's update, the others in step 8's all-reduce. Counted on from there, the ranks would meet
    ``should_save``'s next exchange at different steps and wait for each other in two different collectives."""
    import torch

    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean, "--every", "auto") == [0] * N, _logs(clean)
    assert _run(faulted, "--every", "auto", "--fail", "0:1:7") == [0] * N, _logs(faulted)
    generations = json.loads((faulted / "out" / "generations.json").read_text())
    assert [g["generation"] for g in generations] == [0, 1] and generations[0]["pid"] == generations[1]["pid"]
    assert generations[1]["resumed"] is not None  # the warm-up saves (step 3 shared, step 6 local) are there
    a, b = _weights(clean), _weights(faulted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not _events(faulted, "hang")
    assert "still held" not in _logs(faulted)  # the aborted group was destroyed: its peers failed at once


def test_the_same_error_at_the_same_step_is_restarted_once_then_ends_the_run(tmp_path: Path) -> None:
    codes = _run(tmp_path, "--fail", "*:1:7")
    assert codes == [1] * N, _logs(tmp_path)
    actions = [(e["generation"], e["action"]) for e in _events(tmp_path, "in_process")]
    assert actions == [(0, "restart"), (1, "refused")]
    assert "a software error that repeats" in _events(tmp_path, "in_process")[1]["why"]
    # as without the wrapper: the rank's own error ends the run, not a bad node; nothing requeued
    assert "a software error, not a bad node" in _logs(tmp_path)
    calls = tmp_path / "slurm-calls.log"
    assert not calls.exists() or "requeue" not in calls.read_text()


def test_a_rank_whose_process_died_is_not_waited_for_beyond_the_rejoin_time(tmp_path: Path) -> None:
    codes = _run(tmp_path, "--kill", "0:2:7", "--rejoin-timeout", "3")
    assert codes[2] == -signal.SIGKILL
    assert codes[:2] == [5, 5], _logs(tmp_path)  # a lost peer: the census names it, the job is requeued without it
    [refused] = _events(tmp_path, "in_process")
    assert refused["action"] == "refused" and "did not come back within 3 s" in refused["why"]
    assert "requeue 4242" in (tmp_path / "slurm-calls.log").read_text()


def test_a_stop_after_an_in_process_restart_is_agreed_by_every_rank(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    procs = _start(tmp_path, "--fail", "0:1:7", "--steps", "100000", "--step-time", "0.02", "--ready", str(ready))
    try:
        while not ready.exists():  # generation 1 has trained its first step
            assert all(p.poll() is None for p in procs), _logs(tmp_path)
            time.sleep(0.05)
        procs[random.randrange(N)].send_signal(signal.SIGUSR1)
    finally:
        codes = wait_all(procs, 180)
    assert codes == [3] * N, _logs(tmp_path)  # stopped for a requeue, every rank
    [decision] = _events(tmp_path, "decision")
    [restart] = _events(tmp_path, "in_process")
    assert decision["time"] > restart["time"]  # agreed by generation 1's new agreement
    saves = [e["step"] for e in _events(tmp_path, "save") if e.get("tier") != "local"]
    # the stop's checkpoint, at the agreed step: generation 1 resumed after step 6 and trains step 7 again first
    assert saves[-1] == decision["step"] >= 7
    assert "requeue 4242" in (tmp_path / "slurm-calls.log").read_text()


def test_under_torchrun_the_restart_uses_the_agents_store_and_stays_in_the_same_processes(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from .launch import free_port

    (tmp_path / "local").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "OMP_NUM_THREADS": "1",
                "SLURMRT_LOCAL_CHECKPOINT_DIR": str(tmp_path / "local"), "PYTHONPATH": str(ROOT / "src")})
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), str(WORKER), "--out", str(tmp_path / "out"), "--fail", "0:1:7"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    generations = json.loads((tmp_path / "out" / "generations.json").read_text())
    assert [(g["generation"], g["resumed"]) for g in generations] == [(0, None), (1, 6)]
    assert generations[0]["pid"] == generations[1]["pid"]
