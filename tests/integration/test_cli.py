"""`slurmrt doctor` against the real resolver."""

from __future__ import annotations

from slurmrt import ParallelConfig
from slurmrt.cli.doctor import doctor


def test_doctor_fails_when_the_master_does_not_resolve() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "slurmrt-no-such-host-[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_END_TIME": "4102444800"}
    report = doctor(env, ParallelConfig(), events_dirs=[])
    assert report.failed
    assert any("FAIL  master: slurmrt-no-such-host-1 does not resolve" in line for line in report.lines)
