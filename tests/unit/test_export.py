"""A job submitted with --export=NONE or an export list: the submitting shell's NNODES and SLURMRT_* options do not
reach it (measured on the test cluster: an export list drops SLURMRT_*, NONE drops NNODES). Said once, by rank 0,
when none of them is set in the job."""

from __future__ import annotations

import logging

import pytest

from slurmrt.options import dropped_by_export, warn_unknown


@pytest.mark.parametrize("export", ["NONE", "NIL", "PATH,HOME"])
def test_an_export_that_left_every_slurmrt_variable_behind_is_said(export: str) -> None:
    said = dropped_by_export({"SLURM_EXPORT_ENV": export, "SLURM_JOB_ID": "5"})
    assert said is not None and f"--export={export}" in said and "batch script" in said and "--export=ALL" in said


@pytest.mark.parametrize("env", [{}, {"SLURM_EXPORT_ENV": "ALL"}, {"SLURM_EXPORT_ENV": "ALL,NNODES=2"},
                                 {"SLURM_EXPORT_ENV": "all"},
                                 {"SLURM_EXPORT_ENV": "NONE", "SLURMRT_CHECKPOINT_DIR": "/x"},
                                 {"SLURM_EXPORT_ENV": "PATH", "NNODES": "2"}])
def test_nothing_is_said_where_the_job_has_what_it_needs(env: dict[str, str]) -> None:
    assert dropped_by_export(env) is None


def test_only_the_lead_says_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        warn_unknown({"SLURM_EXPORT_ENV": "NONE"}, lead=False)
        assert not caplog.records
        warn_unknown({"SLURM_EXPORT_ENV": "NONE"}, lead=True)
    assert len(caplog.records) == 1 and "--export=NONE" in caplog.text
