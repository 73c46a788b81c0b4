"""A job-array train on the local Slurm cluster: `--array=1-3%1` over one checkpoint directory, each task training
30 more steps. Each task resumes the newest checkpoint of the task before it (the lease passes from task to task as
each releases it), the last one ends with the weights of an uninterrupted run of 90 steps, bit for bit, and
`slurmrt status` reads the tasks together, as one train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, submit
from .test_scenarios import runs

pytestmark = pytest.mark.timeout(900)

STEPS = 30  # per task


def test_an_array_train_resumes_task_after_task_to_the_weights_of_one_run(cluster: Path, tmp_path: Path) -> None:
    reference = submit(tmp_path / "reference", f"srun $PY $WORKER --out $OUT --steps {3 * STEPS} --step-time 0",
                       "-N1", "--ntasks-per-node=2", name="array-reference")
    body = (f"srun $PY $WORKER --out $OUT-task$SLURM_ARRAY_TASK_ID --steps $((SLURM_ARRAY_TASK_ID * {STEPS})) "
            "--step-time 0 --save-every 10")
    train = submit(tmp_path / "train", body, "--array=1-3%1", "-N1", "--ntasks-per-node=2", name="array-train")
    infos = train.wait_all(600)
    assert {(i["JobState"], i["ExitCode"]) for i in infos} == {("COMPLETED", "0:0")}, train.output()[-3000:]
    assert reference.wait(600)["JobState"] == "COMPLETED", reference.output()[-3000:]
    (uninterrupted,) = runs(tmp_path / "reference", 2)
    for task in (1, 2, 3):
        ranks = [json.loads((tmp_path / "train" / f"run0-task{task}" / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert all(r["start"] == (task - 1) * STEPS and r["trained"] == list(range((task - 1) * STEPS, task * STEPS))
                   for r in ranks), (task, [r["start"] for r in ranks])
    assert ranks[0]["w"] == uninterrupted[0]["w"], "the train's weights differ from an uninterrupted run's"
    ckpt = tmp_path / "train" / "ckpt"
    out = subprocess.run([sys.executable, "-m", "slurmrt", "status", str(ckpt), "--no-chart"], capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("train of experiment")))
    assert "3 job(s) over one checkpoint directory, reached step 89" in lines[start], out.stdout
    ids = [f"{train.id}_{task}" for task in (1, 2, 3)]
    assert lines[start + 1:start + 4] == [  # each task ran with its own --steps: said as other arguments
        f"  {ids[0]}: fresh start; reached step 29",
        f"  {ids[1]}: resumed after step 29; reached step 59; code changed since {ids[0]}: arguments changed",
        f"  {ids[2]}: resumed after step 59; reached step 89; code changed since {ids[1]}: arguments changed"], \
        out.stdout
    assert len({e["experiment"] for e in events_of(ckpt) if e["event"] == "init" and e["rank"] == 0}) == 1


def events_of(ckpt: Path) -> list[dict[str, object]]:
    return [json.loads(line) for f in sorted(ckpt.glob("events-*.jsonl")) for line in f.read_text().splitlines()]
