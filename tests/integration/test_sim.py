"""`slurmrt sim` with real processes: what it does to a job is what Slurm would (../shared/SLURM.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from .conftest import expected_weights
from .launch import ROOT, WORKER

pytestmark = pytest.mark.timeout(240)


def sim(tmp: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 200) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    full.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], cwd=tmp, env=full, capture_output=True,
                          text=True, timeout=timeout)


def _script(tmp: Path, body: str) -> Path:
    path = tmp / f"task-{uuid.uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_time_limit_sends_sigterm_to_every_task_then_sigkill_after_kill_wait(tmp_path: Path) -> None:
    task = _script(tmp_path, """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: open(f"term-{os.environ['SLURM_PROCID']}", "w").close())
        time.sleep(60)
    """)
    began = time.monotonic()
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "2", "--time", "0:02", "--kill-wait", "1", "--",
              sys.executable, str(task))
    assert time.monotonic() - began < 20
    assert sorted(p.name for p in tmp_path.glob("term-*")) == ["term-0", "term-1", "term-2", "term-3"]
    assert "CANCELLED DUE TO TIME LIMIT" in out.stdout and "time limit" in out.stdout
    assert out.returncode == 1


def test_signal_goes_to_the_tasks_or_with_b_only_to_the_batch_shell(tmp_path: Path) -> None:
    task = _script(tmp_path, """
        import os, signal, time
        signal.signal(signal.SIGUSR1, lambda *a: open(f"usr1-{os.environ['SLURM_PROCID']}", "w").close())
        time.sleep(4)
    """)
    sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--time", "0:03", "--signal", "USR1@2", "--",
        sys.executable, str(task))
    assert sorted(p.name for p in tmp_path.glob("usr1-*")) == ["usr1-0", "usr1-1"]
    for p in tmp_path.glob("usr1-*"):
        p.unlink()
    batch = tmp_path / "job.sbatch"
    batch.write_text(f"#!/bin/bash\n#SBATCH -N 1 --ntasks-per-node=2 --time=0:03 --signal=B:USR1@2\n"
                     f"trap 'touch batch-usr1' USR1\nsrun {sys.executable} {task} &\nwait $!\nwait\n")
    sim(tmp_path, str(batch))
    assert (tmp_path / "batch-usr1").exists()
    assert not list(tmp_path.glob("usr1-*")), "B: must not reach the tasks unless the script forwards it"


def test_preemption_saves_requeues_and_resumes_with_a_summary(tmp_path: Path) -> None:
    steps = 120
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--time", "2:00", "--signal", "USR1@5", "--preempt-at",
              "8", "--grace", "10", "--requeue", "--", sys.executable, str(WORKER), "--out", str(tmp_path / "out"),
              "--steps", str(steps), "--step-time", "0.05",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_SAVE_TIME_S": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = out.stdout[out.stdout.index("slurmrt sim summary"):]
    rows = summary.splitlines()[2:]
    assert len(rows) == 2
    assert "preemption (requeued)" in rows[0] and "signal" in rows[0] and "fresh start" in rows[0]
    assert "finished" in rows[1] and "step 119" in rows[1]
    stop = int(rows[0].split("step ")[1].split()[0])
    assert f"step {stop}" in rows[1].split("step 119")[1]  # resumed from the checkpoint of run 0
    final = json.loads((tmp_path / "out" / "rank0.json").read_text())
    assert final["start"] == stop + 1 and final["restart_count"] == 1
    assert final["w"] == pytest.approx(expected_weights(steps, 2), abs=1e-5)


def test_cancel_stops_the_job_without_requeue(tmp_path: Path) -> None:
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--cancel-at", "6", "--requeue", "--", sys.executable,
              str(WORKER), "--out", str(tmp_path / "out"), "--steps", "100000", "--step-time", "0.05",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_SAVE_TIME_S": "1"})
    rows = out.stdout[out.stdout.index("slurmrt sim summary"):].splitlines()[2:]
    assert len(rows) == 1 and "scancel" in rows[0] and "requeued" not in rows[0]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["reasons"] == ["sigterm"] and r["exit_code"] == 4 for r in ranks)


def test_a_failed_node_takes_the_step_down_and_the_batch_script_requeues(tmp_path: Path) -> None:
    batch = tmp_path / "job.sbatch"
    batch.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 2 --ntasks-per-node=1 --requeue",
        f"srun --kill-on-bad-exit=1 {sys.executable} {WORKER} --out {tmp_path}/run${{SLURM_RESTART_COUNT:-0}} "
        "--steps 100 --step-time 0.05 --save-every 10",
        "rc=$?",
        'case $rc in 0|3|4) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', ""]))
    out = sim(tmp_path, "--fail-node", "1", "--at", "6", str(batch),
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "task 1: Killed" in out.stderr
    final = json.loads((tmp_path / "run1" / "rank0.json").read_text())
    assert final["start"] > 0 and final["trained"][-1] == 99
    assert final["w"] == pytest.approx(expected_weights(100, 2), abs=1e-5)


def test_nothing_outlives_sim_even_a_task_that_ignores_sigterm_and_a_daemonised_child(tmp_path: Path) -> None:
    marker = f"slurmrt-orphan-{uuid.uuid4().hex}"
    task = _script(tmp_path, f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"], start_new_session=True)
        time.sleep(300)
    """)
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--time", "0:03", "--kill-wait", "1", "--",
              sys.executable, str(task))
    assert "time limit" in out.stdout
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            or str(task) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_sim_cli_errors_are_clear(tmp_path: Path) -> None:
    out = sim(tmp_path, "--fail-node", "3", "--at", "1", "-N", "2", "--", "true")
    assert out.returncode == 2 and "--fail-node 3: nodes are numbered 0..1" in out.stderr
    out = sim(tmp_path)
    assert out.returncode == 2 and "nothing to run" in out.stderr
