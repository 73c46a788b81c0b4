"""The training inside a container boundary, `slurmrt run` in the batch shell outside: real sbatch jobs on the local
Slurm cluster, the training step wrapped in tests/slurm/container.sh (bubblewrap: none of Slurm's commands inside, a
private /tmp, the job's directory bound in as the shared filesystem is).

Before `slurmrt run` passed the job's end time and the warning signals through its word, and made the requeue
itself, the time-limit job below "squeue said ''"d, never saved before the limit and ended TIMEOUT with no requeue.
Each job must end with the weights of an uninterrupted run, bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import ROOT, Job, submit
from .test_scenarios import assert_trained_exactly_once, events, runs

pytestmark = pytest.mark.timeout(900)

CONTAINER = ROOT / "tests" / "slurm" / "container.sh"
STEPS = 150


def _in_container(directory: Path, worker_args: str) -> str:
    """The batch script's last line: `slurmrt run` outside, the training step in the container."""
    return (f"exec $PY -m slurmrt run -- {CONTAINER} {directory} {ROOT} -- $PY $WORKER --out $OUT --steps {STEPS} "
            f"{worker_args}")


@pytest.fixture(scope="module")
def jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Job, Path]]:
    """Submitted together, so that they run side by side."""
    if shutil.which("bwrap") is None:  # tests/slurm/cluster.sh installs it with Slurm; CI must run these
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("bubblewrap is not installed: "
                                                                         "`tests/slurm/cluster.sh install` (root)")
    made: dict[str, tuple[Job, Path]] = {}
    d = tmp_path_factory.mktemp("container-reference")
    made["reference"] = (submit(d, f"srun $PY $WORKER --out $OUT --steps {STEPS} --step-time 0", "-N2",
                                "--ntasks-per-node=1", name="container-reference"), d)
    d = tmp_path_factory.mktemp("container-timelimit")
    made["timelimit"] = (submit(d, _in_container(d, "--step-time 0.4"), "-N2", "--ntasks-per-node=1", "--time=1",
                                "--requeue", name="container-timelimit",
                                exports={"SLURMRT_DEADLINE_MARGIN_S": "8", "SLURMRT_SAVE_TIME_S": "3"}), d)
    d = tmp_path_factory.mktemp("container-signal")
    made["signal"] = (submit(d, _in_container(d, "--step-time 0.7"), "-N2", "--ntasks-per-node=1", "--time=2",
                             "--signal=B:USR1@30", "--requeue", name="container-signal",
                             exports={"SLURMRT_DEADLINE": "0", "SLURMRT_WATCH_INTERVAL_S": "0.5"}), d)
    for fault in ("kill", "hang"):
        d = tmp_path_factory.mktemp(f"container-{fault}")
        made[fault] = (submit(d, _in_container(d, f"--step-time 0.05 --save-every 10 --fault {fault} --fault-at 35"),
                              "-N2", "--ntasks-per-node=1", "--no-kill", "--requeue", name=f"container-{fault}",
                              exports={"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5"}), d)
    return made


@pytest.fixture(scope="module")
def uninterrupted(jobs: dict[str, tuple[Job, Path]]) -> list[float]:
    job, d = jobs["reference"]
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED", job.output()[-3000:]
    (ranks,) = runs(d, 2)
    return list(ranks[0]["w"])


@pytest.mark.parametrize("name", ["timelimit", "signal"])
def test_a_training_in_a_container_saves_before_the_end_requeues_and_resumes_to_the_same_weights(
        jobs: dict[str, tuple[Job, Path]], uninterrupted: list[float], name: str) -> None:
    """The time limit with no signal (the end time comes from `slurmrt run`'s word), or the `--signal=B:USR1`
    warning that only the batch shell receives: the ranks stop at one step, save, `slurmrt run` outside makes the
    requeue the training chose, and the requeued run resumes and finishes."""
    job, d = jobs[name]
    info = job.wait(800)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, out[-4000:]
    all_runs = runs(d, 2)
    assert_trained_exactly_once(all_runs, STEPS, 2)
    reason = "deadline" if name == "timelimit" else "signal"
    assert all(r["reasons"] == [reason] for ranks in all_runs[:-1] for r in ranks), all_runs
    ev = events(d, job)
    assert [e["done"] for e in ev if e["event"] == "requeue"][:1] == [True], out[-4000:]
    assert all(e["rank"] == -1 for e in ev if e["event"] == "requeue"), "the requeue is made outside, by slurmrt run"
    assert "no scontrol here" in out and "squeue said" not in out
    assert all_runs[-1][0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_killed_or_hung_process_in_a_container_is_restarted_in_the_job_to_the_same_weights(
        jobs: dict[str, tuple[Job, Path]], uninterrupted: list[float], fault: str) -> None:
    """Rank 1 dies of SIGKILL (or hangs) at step 35 inside the container: the request (or srun's word that the task
    ended) reaches `slurmrt run` through the job's directory, which starts a new step on the same nodes; it resumes
    from the last checkpoint and ends with the weights of an uninterrupted run."""
    job, d = jobs[fault]
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    ev = events(d, job)
    decisions = [e for e in ev if e["event"] == "recovery"]
    assert [e["action"] for e in decisions] == ["in_job_restart"], out[-4000:]
    final = [json.loads((d / "run0.1" / f"rank{r}.json").read_text()) for r in range(2)]  # the new step's
    assert all(r["in_job_restarts"] == 1 and r["exit_code"] == 0 for r in final)
    assert final[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"
