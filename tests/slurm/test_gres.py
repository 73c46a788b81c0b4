"""Jobs that hold the nodes' GPUs as Slurm GRES (the test cluster gives each node two, tests/slurm/cluster.sh), their
training step holding all of them: slurmrt run's word carries the `--signal=B:` warning without a side step, and
after a killed process the health probe (`srun --overlap`, once the step has ended) and the new step both start.

Measured on this cluster (Slurm 22.05): an `--overlap` side step inherits the job's GPU request and shares the
step's GPUs; `--gres=none` makes srun refuse the step ("Invalid Trackable RESource"). So slurmrt asks for no side
step while a training step runs, and probes only once the step has ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ROOT, Job, submit
from .test_scenarios import assert_trained_exactly_once, events, runs

pytestmark = pytest.mark.timeout(900)


#: The GPUs' NVML, stood in (tests/slurm/fake_nvml): the GRES here have no devices behind them.
NVML = {"PYTHONPATH": f"{ROOT / 'tests' / 'slurm' / 'fake_nvml'}:{ROOT / 'src'}"}


@pytest.fixture(scope="module")
def jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Job, Path]]:
    made = {}
    d = tmp_path_factory.mktemp("gres-signal")
    made["signal"] = (submit(d, "exec $PY -m slurmrt run -- $PY $WORKER --out $OUT --steps 150 --step-time 0.7",
                             "-N2", "--ntasks-per-node=1", "--gpus-per-node=2", "--time=2", "--signal=B:USR1@30",
                             "--requeue", name="gres-signal",
                             exports={"SLURMRT_DEADLINE": "0", "SLURMRT_WATCH_INTERVAL_S": "0.5", **NVML}), d)
    for name, held in (("kill", {}), ("held", {"FAKE_NVML_HELD": "n2"})):
        d = tmp_path_factory.mktemp(f"gres-{name}")
        made[name] = (submit(d, "exec $PY -m slurmrt run --spare-nodes 1 -- $PY $WORKER --out $OUT --steps 80 "
                                "--step-time 0.05 --save-every 10 --fault kill --fault-at 35",
                             "-N3", "--ntasks-per-node=1", "--gpus-per-node=2", "--no-kill", "--requeue",
                             "--nodelist=n[1-3]", name=f"gres-{name}",
                             exports={"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", **NVML, **held}),
                      d)
    return made


def test_the_warning_reaches_a_training_that_holds_every_gpu(jobs: dict[str, tuple[Job, Path]]) -> None:
    job, d = jobs["signal"]
    info = job.wait(800)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, out[-4000:]
    all_runs = runs(d, 2)
    assert_trained_exactly_once(all_runs, 150, 2)
    assert all(r["reasons"] == ["signal"] for ranks in all_runs[:-1] for r in ranks), all_runs
    assert "SIGUSR1: passed to the training processes on n[" in out and "--overlap" not in out


def test_a_killed_process_is_probed_and_restarted_where_the_step_held_every_gpu(
        jobs: dict[str, tuple[Job, Path]]) -> None:
    job, d = jobs["kill"]
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    (decision,) = [e for e in events(d, job) if e["event"] == "recovery"]
    assert decision["action"] == "in_job_restart" and decision["left_out"] == [], decision
    # The probe ran on the suspect and answered (a probe that waited for the GPUs would not have: "did not answer").
    assert [(e["in_job"], e["failures"]) for e in decision["evidence"]] == [(True, [])], decision


def test_a_gpu_a_leftover_process_holds_sends_its_node_out_for_the_spare(jobs: dict[str, tuple[Job, Path]]) -> None:
    """The same kill, and NVML says a process of the dead step still holds GPU 1 of n2: the probe names it, the
    node goes out and the spare takes its place (it would have run out of memory, or hung, in the next step)."""
    job, d = jobs["held"]
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    (decision,) = [e for e in events(d, job) if e["event"] == "recovery"]
    assert decision["action"] == "in_job_restart" and decision["left_out"] == ["n2"], decision
    ((node, failures),) = [(e["node"], e["failures"]) for e in decision["evidence"]]
    assert node == "n2" and failures and "GPU 1" in failures[0] and "pid 4242" in failures[0], decision
