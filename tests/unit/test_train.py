"""A train of jobs over one checkpoint directory, read together (slurmrt.record.train): in start order, each job's
resume against the newest checkpoint of the job before, and a job that resumed an older one said."""

from __future__ import annotations

from slurmrt.record.timeline import JobLife, RunLife
from slurmrt.record.train import trains


def _job(job: str, start: float, resumed: int | None, saved: list[int], experiment: str | None = "e1") -> JobLife:
    run = RunLife(restart=0, start=start, end=start + 10, resumed_from=resumed,
                  checkpoints=[(start + 1 + i, s, 0.1) for i, s in enumerate(saved)])
    run.last_step = saved[-1] if saved else None
    return JobLife(job=job, experiment=experiment, runs=[run])


def test_the_jobs_of_one_experiment_are_read_in_start_order_and_an_older_resume_is_said() -> None:
    lines = trains([_job("9_3", 300, 19, [29]), _job("9_1", 100, None, [9, 19]), _job("9_2", 200, 9, [19]),
                    _job("other", 50, None, [5], experiment="e2")])
    assert lines == [
        "train of experiment e1: 3 job(s) over one checkpoint directory, reached step 29",
        "  9_1: fresh start; reached step 19",
        "  9_2: resumed after step 9 (not the newest checkpoint: 9_1 committed step 19); reached step 19",
        "  9_3: resumed after step 19; reached step 29",
    ]


def test_one_job_alone_or_without_an_experiment_is_no_train() -> None:
    assert trains([_job("1", 0, None, [1]), _job("2", 5, 1, [2], experiment=None)]) == []
