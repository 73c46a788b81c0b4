"""The examples run as documented: the Accelerate one under `slurmrt sim`, with its sbatch file's signal pattern."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .launch import ROOT, step_env

pytestmark = pytest.mark.timeout(300)


def test_slurmrt_signal_reaches_the_training_processes_and_spares_the_launcher(tmp_path: Path) -> None:
    """A launcher that dies of SIGUSR1 (as torchrun does) survives; its two training processes get the signal."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import os, signal, sys, time, slurmrt
        rt = slurmrt.init()
        open(f"ready-{os.getpid()}", "w").close()
        deadline = time.time() + 60
        while time.time() < deadline and not rt.should_stop(0):
            time.sleep(0.05)
        open(f"stopped-{os.getpid()}", "w").close()
        rt.close()
    """))
    launcher = tmp_path / "launcher.py"  # the default SIGUSR1 action, like torchrun's: terminate
    launcher.write_text(textwrap.dedent(f"""
        import subprocess, sys
        procs = [subprocess.Popen([sys.executable, {str(worker)!r}]) for _ in range(2)]
        sys.exit(max(p.wait() for p in procs))
    """))
    env = step_env(0, 1, tmp_path, port=29999)
    env["SLURMRT_DEADLINE"] = "0"
    proc = subprocess.Popen([sys.executable, str(launcher)], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.05)
    out = subprocess.run([sys.executable, "-m", "slurmrt", "signal", "USR1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "SIGUSR1 to 2 training process(es)" in out.stdout, out.stdout + out.stderr
    assert proc.wait(timeout=60) == 0, "the launcher must not have received the signal"
    assert len(list(tmp_path.glob("stopped-*"))) == 2


def test_slurmrt_signal_with_nothing_registered_exits_1(tmp_path: Path) -> None:
    env = step_env(0, 1, tmp_path, port=29998, job_id="no-such-job")
    out = subprocess.run([sys.executable, "-m", "slurmrt", "signal", "USR1"], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "no training process of job no-such-job is registered" in out.stdout, out.stdout
    assert "nothing was signalled" in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed")
def test_accelerate_example_stops_on_the_forwarded_signal_requeues_and_resumes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    script = tmp_path / "job.sbatch"
    # Run 0 trains until it is stopped (100000 steps is a cap it never reaches); the preemption comes after its
    # first checkpoint, so it certainly hits a running job. Run 1 trains 60 steps past the step it resumes from.
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 1 --ntasks-per-node=1 --signal=B:USR1@45 --requeue
        cd {ROOT}
        trap 'srun --overlap --ntasks-per-node=1 {sys.executable} -m slurmrt signal USR1' USR1
        STEPS=100000
        if [ -f {ckpt}/latest ]; then STEPS=$(( 10#$(sed 's/^step_//' {ckpt}/latest) + 61 )); fi
        srun bash -c '{accelerate} launch --cpu --num_processes 2 --num_machines 1 --mixed_precision no \\
            --dynamo_backend no examples/accelerate/train.py --checkpoint-dir {ckpt} --steps '$STEPS' \\
            --save-every 20' &
        SRUN_PID=$!
        wait $SRUN_PID
        wait $SRUN_PID
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "SLURMRT_DEADLINE_MARGIN_S": "5", "SLURMRT_SAVE_TIME_S": "2",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"})
    out = subprocess.run([sys.executable, "-m", "slurmrt", "sim", "--max-restarts", "3", "--preempt-at", "0",
                          "--after-checkpoint", "--grace", "30", str(script)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = out.stdout[out.stdout.index("slurmrt sim summary"):].split("\n\n")[0].splitlines()[2:]
    assert len(rows) == 2 and "signal" in rows[0] and "finished" in rows[1], rows
    resumed = int(rows[1].split("step ")[-1])
    assert resumed >= 19
    assert f"finished {resumed + 61} steps" in out.stdout + out.stderr
    assert (ckpt / "latest").read_text().strip() == f"step_{resumed + 60:09d}"
    assert {"model.safetensors", "optimizer.bin"} <= {p.name for p in (ckpt / f"step_{resumed + 60:09d}").iterdir()}
