"""Slurm's warning signal reaches every process of the step (`--signal=USR1@N` without B:), helpers included. With
slurmrt the training process records it and its helpers live on: a spawned multiprocessing Manager (Megatron's
saver uses one), the resource tracker, a spawned DataLoader worker and a plain subprocess. Without slurmrt the same
signal kills them: the control run shows that the test can fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .launch import ROOT

pytestmark = pytest.mark.timeout(240)

SCRIPT = textwrap.dedent('''
    import json, multiprocessing, os, subprocess, sys, time
    from multiprocessing import resource_tracker
    import psutil

    import torch.utils.data

    class Numbers(torch.utils.data.Dataset):
        def __len__(self):
            return 10 ** 6

        def __getitem__(self, i):
            return i

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    if __name__ == "__main__":  # spawned children import this file again: init() only in the training process
        USE_SLURMRT = sys.argv[2] == "slurmrt"
        if USE_SLURMRT:
            import slurmrt
            rt = slurmrt.init()
        ctx = multiprocessing.get_context("spawn")
        manager = ctx.Manager()
        shared = manager.dict()
        batches = iter(torch.utils.data.DataLoader(Numbers(), num_workers=1, multiprocessing_context="spawn"))
        next(batches)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        helpers = {"manager": manager._process.pid, "loader worker": batches._workers[0].pid,
                   "resource tracker": resource_tracker._resource_tracker._pid, "subprocess": sleeper.pid}
        out = sys.argv[1]
        with open(out + ".tmp", "w") as f:
            json.dump(helpers, f)
        os.rename(out + ".tmp", out)  # ready: the test sends the warning now
        if USE_SLURMRT:
            step = 0
            while not rt.should_stop(step):
                step += 1
                time.sleep(0.01)
        else:
            time.sleep(600)  # killed by the warning before this ends
        time.sleep(0.5)  # a helper killed by the signal has certainly died by now
        result = {name: alive(pid) for name, pid in helpers.items()}
        shared["saved"] = True  # the Manager still serves: a save through it works
        result["manager answers"] = shared["saved"]
        result["loader answers"] = next(batches) is not None
        print("RESULT " + json.dumps(result), flush=True)
        sleeper.kill()
        if USE_SLURMRT:
            rt.close()
''')


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    script = tmp_path / "helpers.py"
    script.write_text(SCRIPT)
    ready = tmp_path / f"ready-{mode}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen([sys.executable, str(script), str(ready), mode], env=env, cwd=tmp_path,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the helpers never started"
            time.sleep(0.05)
        helpers = json.loads(ready.read_text())
        os.killpg(proc.pid, signal.SIGUSR1)  # every process of the group, as Slurm signals every process of a step
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), helpers


def test_the_warning_signal_leaves_the_helpers_of_a_slurmrt_process_alive(tmp_path: Path) -> None:
    out, _ = _run(tmp_path, "slurmrt")
    line = next((line for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    assert result == {"manager": True, "loader worker": True, "resource tracker": True, "subprocess": True,
                      "manager answers": True, "loader answers": True}


def test_without_slurmrt_the_same_signal_kills_the_process_and_its_helpers(tmp_path: Path) -> None:
    import psutil

    out, helpers = _run(tmp_path, "plain")
    assert out.returncode == -signal.SIGUSR1
    time.sleep(0.5)
    dead = [name for name, pid in helpers.items() if not psutil.pid_exists(pid) or
            psutil.Process(pid).status() == psutil.STATUS_ZOMBIE]
    assert {"manager", "subprocess"} <= set(dead), dead
