"""One experiment across a requeue, under `slurmrt sim`: the trackers continue their run, and `slurmrt status`
tells and draws the job's life. The job: 2 nodes, the trackers example logging to W&B (offline), MLflow (files)
and TensorBoard; the last rank dies after step 15 of the first run (a node failure, tied to the job's progress),
the batch script requeues, and the second run resumes from the checkpoint of step 9 and trains to step 39."""

from __future__ import annotations

import json
import multiprocessing
import os
import pty
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurmrt import trackers
from slurmrt.record.chart import duration
from slurmrt.record.events import Event, read_events
from slurmrt.record.experiment import EXPERIMENT_FILE, establish
from slurmrt.record.runs import runs

from .launch import ROOT
from .test_sim import sim


def _rt(tmp_path: Path, resumed: int | None, *, loaded: bool = True) -> Any:
    return SimpleNamespace(experiment_id="4711-abcd1234", resumed_step=resumed, loaded=loaded,
                           options=SimpleNamespace(checkpoint_dir=tmp_path))


def _establish(directory: Path, barrier: Any, out: Any) -> None:
    barrier.wait()
    out.put(establish(directory, job=None))


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """MLflow on a file store under tmp_path, and an empty checkpoint directory tmp_path/ckpt; yields mlflow."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    (tmp_path / "ckpt").mkdir()
    return mlflow

pytestmark = pytest.mark.timeout(300)

STEPS, SAVE_EVERY, KILL_AT = 40, 10, 15


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("experiment")
    batch = tmp / "job.sbatch"
    batch.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 2 --ntasks-per-node=1 --requeue",
        # --kill-on-bad-exit=0: rank 0 then ends by itself on gloo's "connection closed" and finishes its exit.
        # With =1, srun's SIGKILL can land while MLflow's exit handler rewrites the run's meta.yaml (the file store
        # writes it in place), and the next run cannot read its own MLflow run.
        f"srun --kill-on-bad-exit=0 {sys.executable} {ROOT / 'examples' / 'trackers' / 'train.py'} "
        f"--steps {STEPS} --save-every {SAVE_EVERY} --kill-at {KILL_AT} --checkpoint-dir {tmp}/ckpt "
        f"--wandb-dir {tmp}/wandb-logs --mlflow-uri file:{tmp}/mlruns --tensorboard-dir {tmp}/tb",
        "rc=$?",
        'case $rc in 0|3|4) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', "exit $rc", ""]))
    out = sim(tmp, str(batch), env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true",
                                    "SLURMRT_PROGRESS_S": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "finished 40 steps" in out.stdout, out.stdout[-3000:]
    return tmp


def _events(job: Path) -> list[dict[str, Any]]:
    (log,) = (job / "ckpt").glob("events-*.jsonl")
    return list(read_events(log))


def _experiment(job: Path) -> str:
    return str(json.loads((job / "ckpt" / "experiment.json").read_text())["id"])


def test_both_runs_belong_to_the_experiment_stored_with_the_checkpoints(job: Path) -> None:
    inits = [e for e in _events(job) if e["event"] == "init"]
    assert [e["restart"] for e in inits] == [0, 1]
    assert {e["experiment"] for e in inits} == {_experiment(job)}


def test_wandb_logs_both_runs_under_one_run_id(job: Path) -> None:
    dirs = sorted((job / "wandb-logs" / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2, dirs
    assert {d.name.split("-", 3)[-1] for d in dirs} == {_experiment(job)}


def test_mlflow_has_one_run_with_every_step(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(f"file:{job / 'mlruns'}")
    found = client.search_runs(experiment_ids=["0"])
    assert [r.info.run_id for r in found] == [json.loads((job / "ckpt" / "trackers.json").read_text())["mlflow"]]
    steps = {m.step for m in client.get_metric_history(found[0].info.run_id, "loss")}
    assert steps == set(range(STEPS))


def test_tensorboard_shows_each_step_once_after_the_purge(job: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    written = Counter(e.step for f in sorted((job / "tb").glob("events.out.tfevents.*"))
                      for e in EventFileLoader(str(f)).Load() if e.summary.value)
    # The first run logged steps 10..14 at least before its checkpoint-less death: the files hold them twice...
    assert {s for s, n in written.items() if n > 1} >= set(range(SAVE_EVERY, KILL_AT))
    accumulator = EventAccumulator(str(job / "tb"))
    accumulator.Reload()
    # ...and what TensorBoard shows has each step once: purge_step dropped the first run's steps from 10 on.
    assert [s.step for s in accumulator.Scalars("loss")] == list(range(STEPS))


def test_status_tells_the_jobs_life_with_the_figures_of_its_event_log(job: Path, tmp_path: Path) -> None:
    events = _events(job)
    run0, run1 = runs(events)
    # Where run 0 got to: its progress samples, and the survivor's exit event (the step it was at).
    last_step0 = max(e["step"] for e in [*run0.all(Event.PROGRESS), *run0.all(Event.EXIT)]
                     if isinstance(e.get("step"), int))
    lost = last_step0 - run1.resumed_from
    assert run1.resumed_from == SAVE_EVERY - 1 and lost >= KILL_AT - SAVE_EVERY
    # each run, before init(): from Slurm's start of it (rank 0's first progress event says it: squeue's %S) or, where
    # longer, its process's own time before init()
    own = [(r.first(Event.INIT) or {}).get("process_s") or 0.0 for r in (run0, run1)]
    said = [next((e["slurm_start"] for e in r.all(Event.PROGRESS) if "slurm_start" in e), None) for r in (run0, run1)]
    before = [max(o, r.start - s) if s is not None else o for o, s, r in zip(own, said, (run0, run1), strict=True)]
    assert all(0.0 < b < 600.0 for b in before), before
    # Slurm's start is whole seconds: run 1's may read up to a second before run 0's last event. The timeline
    # does not let a process start reach back into the run before, so the wait is then none.
    gap = max(0.0, run1.start - before[1] - run0.end)
    saving = sum(e["seconds"] for e in events if e["event"] == "save" and e["rank"] == 0)
    status = subprocess.run([sys.executable, "-m", "slurmrt", "status", str(job / "ckpt"), "--plot",
                             str(tmp_path / "life.png")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert f"experiment {_experiment(job)}: 2 run(s): 1 requeue(s), 0 in-job restart(s)" in text
    # Task 1 is killed; task 0, the survivor, names it and records the end of the run (exit 5, PEER_LOST: not a hang).
    assert f"run 0: fresh start; no stop; last checkpoint step {SAVE_EVERY - 1}; exit PEER_LOST" in text
    assert f"(at least {lost} step(s))" in text
    assert f"run 1: resumed after step {SAVE_EVERY - 1}; no stop; last checkpoint step {STEPS - 1}; exit FINISHED; " \
        f"reached step {STEPS - 1}" in text
    wall = run1.end - (run0.start - before[0])
    assert f"reached step {STEPS - 1} in {duration(wall)}; work lost {lost} step(s)" in text
    saves = sum(1 for e in events if e["event"] == "save" and e["rank"] == 0)  # a step saved twice counts once
    assert f"waiting between runs {duration(gap)}; saving {duration(saving)} ({saves} checkpoint(s))" in text
    assert "!" in text.split("timeline")[1], "the lost steps are drawn"
    import matplotlib.image

    pixels = matplotlib.image.imread(tmp_path / "life.png")
    assert pixels.shape[:2] == (600, 1000) and (pixels[..., :3].min(axis=2) < 0.9).mean() > 0.02


def test_sim_shows_the_runs_progress_on_a_terminal(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "SLURMRT_PROGRESS_S": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "slurmrt", "sim", "-N", "1", "--", sys.executable,
                             str(ROOT / "examples" / "quickstart" / "train.py"), "--steps", "30", "--step-time", "0.1",
                             "--checkpoint-dir", str(tmp_path / "ckpt")], stdout=follower, stderr=follower, env=env,
                            cwd=tmp_path)
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert proc.wait(120) == 0
    reader.join(30)
    os.close(leader)
    text = b"".join(chunks).decode(errors="replace")
    assert re.search(r"slurmrt sim: run 0: step \d+, last checkpoint", text), text[-2000:]  # a sample a second
    # and not in a pipe: a log file gets no progress lines
    piped = sim(tmp_path, "-N", "1", "--", sys.executable, str(ROOT / "examples" / "quickstart" / "train.py"),
                "--steps", "5", "--checkpoint-dir", str(tmp_path / "ckpt2"), env={"SLURMRT_PROGRESS_S": "1"})
    assert piped.returncode == 0 and "run 0: step" not in piped.stdout


NO_FINAL_SAVE = """\
import sys, slurmrt
rt = slurmrt.init(checkpoint_dir=sys.argv[1])
for step in range(40):
    if rt.should_stop(step):
        break
    if step % 12 == 11:
        rt.save({"step": step}, step=step)
rt.exit()
"""


def test_status_reports_the_step_a_run_reached_after_its_last_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NO_FINAL_SAVE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    ckpt = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, str(tmp_path / "train.py"), str(ckpt)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (exit_event,) = [e for e in _events(tmp_path) if e["event"] == "exit"]
    assert exit_event["step"] == 39
    status = subprocess.run([sys.executable, "-m", "slurmrt", "status", str(ckpt), "--no-chart"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "last checkpoint step 35; exit FINISHED; reached step 39" in status.stdout, status.stdout
    assert "totals: 1 run(s), reached step 39" in status.stdout


def test_processes_racing_to_create_the_id_all_get_the_one_that_won(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_establish, args=(tmp_path, barrier, out)) for _ in range(8)]
    for p in procs:
        p.start()
    ids = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(60)
    assert len(ids) == 1 and json.loads((tmp_path / EXPERIMENT_FILE).read_text())["id"] in ids
    assert sorted(p.name for p in tmp_path.iterdir()) == [EXPERIMENT_FILE], "no temporary file left behind"


def test_mlflow_creates_one_run_then_every_later_run_resumes_it(tmp_path: Path, mlflow_store: Any) -> None:
    mlflow = mlflow_store
    ckpt = tmp_path / "ckpt"
    ids = []
    for _ in range(2):
        run = trackers.mlflow_start_run(_rt(ckpt, None))
        ids.append(run.info.run_id)
        mlflow.end_run()
    assert ids[0] == ids[1] == trackers.mlflow_run_id(_rt(ckpt, None))
    assert mlflow.get_run(ids[0]).data.tags["slurmrt.experiment"] == "4711-abcd1234"


def test_an_mlflow_run_that_cannot_be_resumed_gives_a_new_run_not_a_crash(tmp_path: Path, mlflow_store: Any,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    mlflow = mlflow_store
    ckpt = tmp_path / "ckpt"
    first = trackers.mlflow_start_run(_rt(ckpt, None)).info.run_id
    mlflow.end_run()
    (meta,) = (tmp_path / "mlruns").glob(f"*/{first}/meta.yaml")
    meta.write_text("")  # what a SIGKILL during MLflow's in-place rewrite leaves
    second = trackers.mlflow_start_run(_rt(ckpt, None)).info.run_id
    mlflow.end_run()
    assert second != first and trackers.mlflow_run_id(_rt(ckpt, None)) == second
    assert "cannot be resumed" in caplog.text
