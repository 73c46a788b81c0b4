"""The Slurm job as its variables describe it (slurmrt.launch.slurmvars.Job), read once and strictly: what slurmrt run,
slurmrt env and the guard job read, and what they refuse."""

from __future__ import annotations

import pytest

from slurmrt._errors import EnvironmentVariableError
from slurmrt.launch.slurmvars import Job, job_of

ENV = {"SLURM_JOB_ID": "812", "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_TASKS_PER_NODE": "4(x3)",
       "SLURM_RESTART_COUNT": "2", "SLURM_JOB_PARTITION": "batch", "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_QOS": "",
       "SLURM_CLUSTER_NAME": "east"}


def test_the_job_is_read_once_from_its_variables() -> None:
    job = job_of(ENV)
    assert job == Job("812", ("gpu01", "gpu02", "gpu03"), 4, 2, None, None, "batch", "ml", None, "east")
    assert job.requeue_id == "812" and job.placement_options() == ["--partition=batch", "--account=ml"]
    task = job_of({**ENV, "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "12", "SLURM_NTASKS_PER_NODE": "8"})
    assert task is not None and task.requeue_id == "800_12" and task.tasks_per_node == 8
    assert job_of({k: v for k, v in ENV.items() if k != "SLURM_JOB_ID"}) is None  # not in a Slurm job
    bare = job_of({"SLURM_JOB_ID": "5"})
    assert bare is not None and bare.nodes == () and bare.tasks_per_node == 1 and bare.restart_count == 0


@pytest.mark.parametrize(("name", "value"), [("SLURM_JOB_NODELIST", "gpu[01-"), ("SLURM_RESTART_COUNT", "two"),
                                             ("SLURM_RESTART_COUNT", "-1"), ("SLURM_TASKS_PER_NODE", "junk"),
                                             ("SLURM_NTASKS_PER_NODE", "0"), ("SLURM_NTASKS_PER_NODE", "²")])
def test_a_malformed_value_is_refused_with_its_name(name: str, value: str) -> None:
    """Strict everywhere: a restart count that is no number read as 0 made slurmrt run's event log disagree with the
    training's, which refuses it."""
    with pytest.raises(EnvironmentVariableError, match=name):
        job_of({**ENV, name: value})
