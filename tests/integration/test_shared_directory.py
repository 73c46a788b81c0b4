"""Two jobs on one checkpoint directory, as real processes: the second is refused at init() and the first loses
nothing. On the main before the "nothing lost, nobody in" issue, job 7001 took 7002's experiment and weights, and
each job's clean-up deleted the other's saves in progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A training job that saves at every step, and holds at step 10 until the test says go: the second job starts
#: while the first certainly runs and holds the directory.
JOB = '''
import json, sys, time
from pathlib import Path
import torch
import slurmrt

ckpt, hold, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
rt = slurmrt.init(checkpoint_dir=ckpt, deadline=False)
w = torch.zeros(8)
start = 0
got = rt.load_latest()
if got is not None:
    start, w = got[0] + 1, got[1]["w"]
for step in range(start, steps):
    w = w - 0.01 * torch.randn(8, generator=torch.Generator().manual_seed(step))
    rt.should_stop(step)
    rt.save({"w": w, "job": rt.job_id}, step=step)
    if step == 10:
        print("holding", flush=True)
        while not hold.exists():
            time.sleep(0.05)
print(json.dumps({"experiment": rt.experiment_id, "w": w.tolist(), "start": start}), flush=True)
rt.finish()
'''


def _job(job_id: str, ckpt: Path, hold: Path, tmp: Path, steps: int = 40) -> subprocess.Popen[str]:
    script = tmp / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"SLURM_JOB_ID": job_id, "PYTHONPATH": str(ROOT / "src"), "PATH": str(tmp / "nobin") + ":/usr/bin:/bin"})
    return subprocess.Popen([sys.executable, str(script), str(ckpt), str(hold), str(steps)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_job_on_a_live_jobs_directory_is_refused_and_the_first_loses_nothing(tmp_path: Path) -> None:
    ckpt, hold = tmp_path / "ckpt", tmp_path / "go"
    first = _job("7001", ckpt, hold, tmp_path)
    assert first.stdout is not None and first.stdout.readline().strip() == "holding"
    experiment = json.loads((ckpt / "experiment.json").read_text())
    second = _job("7002", ckpt, hold, tmp_path)
    out, err = second.communicate(timeout=300)
    assert second.returncode != 0, out
    assert "LeaseError" in err and "in use by job 7001" in err and "own checkpoint_dir" in err, err
    assert not (ckpt / "events-7002.jsonl").exists()
    assert json.loads((ckpt / "experiment.json").read_text()) == experiment
    hold.touch()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])

    alone = _job("7003", tmp_path / "alone", hold, tmp_path)  # the same training with nobody beside it
    alone_out, alone_err = alone.communicate(timeout=300)
    assert alone.returncode == 0, alone_err
    assert result["w"] == json.loads(alone_out.strip().splitlines()[-1])["w"]  # bitwise

    latest = (ckpt / "latest").read_text().strip()
    state = __import__("torch").load(ckpt / latest / "rank_00000.pt", weights_only=False)
    assert latest == "step_000000039" and state["job"] == "7001" and state["w"].tolist() == result["w"]
    assert not (ckpt / ".slurmrt-lease.json").exists()  # released at the end: the next job may come

    # Resubmitted once the first ended: the directory is free, the experiment and the progress continue.
    again = _job("7002", ckpt, hold, tmp_path, steps=42)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    resumed = json.loads(out.strip().splitlines()[-1])
    assert resumed["start"] == 40 and resumed["experiment"] == result["experiment"]


def test_a_killed_jobs_directory_is_taken_over_by_the_next_job(tmp_path: Path) -> None:
    ckpt, hold = tmp_path / "ckpt", tmp_path / "go"
    first = _job("8001", ckpt, hold, tmp_path)
    assert first.stdout is not None and first.stdout.readline().strip() == "holding"
    first.kill()  # SIGKILL: the lease stays behind, its process gone
    first.wait()
    hold.touch()
    nxt = _job("8002", ckpt, hold, tmp_path, steps=12)
    out, err = nxt.communicate(timeout=300)
    assert nxt.returncode == 0, err
    assert "taking over the lease of job 8001" in err and "is gone from" in err
    assert json.loads(out.strip().splitlines()[-1])["start"] == 11
