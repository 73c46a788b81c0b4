"""A train of jobs over one checkpoint directory (``--array=1-N%1``, or jobs submitted one after another): each job
has its own event log, and they share the experiment (``experiment.json`` next to the checkpoints). ``slurmrt
status`` reads them together: which job resumed from what, whether each resumed the newest checkpoint the job
before it committed, how far the train got, and where the code changed from one job to the next."""

from __future__ import annotations

from collections.abc import Iterable

from .code import changes
from .timeline import JobLife

__all__ = ["trains"]


def trains(lives: Iterable[JobLife]) -> list[str]:
    """The lines of each train: the jobs of one experiment, two or more, in the order they started."""
    grouped: dict[str, list[JobLife]] = {}
    for life in lives:
        if life.experiment and life.runs:
            grouped.setdefault(life.experiment, []).append(life)
    out: list[str] = []
    for experiment, jobs in grouped.items():
        if len(jobs) > 1:
            out += _train(experiment, sorted(jobs, key=lambda j: j.runs[0].start))
    return out


def _train(experiment: str, jobs: list[JobLife]) -> list[str]:
    reached = max((j.last_step for j in jobs if j.last_step is not None), default=None)
    out = [f"train of experiment {experiment}: {len(jobs)} job(s) over one checkpoint directory, "
           + (f"reached step {reached}" if reached is not None else "no step recorded")]
    before: JobLife | None = None
    for job in jobs:
        out.append(f"  {job.job}: {_link(before, job)}")
        before = job
    return out


def _link(before: JobLife | None, job: JobLife) -> str:
    """How ``job`` took over from the job ``before`` it: what it resumed, against the newest checkpoint ``before``
    committed, how far it got, and what code changed."""
    first = job.runs[0]
    said = [_resumed(before, first.resumed_from),
            f"reached step {job.last_step}" if job.last_step is not None else "no step recorded"]
    changed = changes(before.runs[-1].code, first.code) if before is not None else []
    if before is not None and changed:
        said.append(f"code changed since {before.job}: {', '.join(changed)}")
    return "; ".join(said)


def _resumed(before: JobLife | None, step: int | None) -> str:
    """What a job resumed from, and whether it was the newest checkpoint the job ``before`` it committed."""
    said = "fresh start" if step is None else f"resumed after step {step}"
    newest = max((c[1] for r in before.runs for c in r.checkpoints), default=None) if before is not None else None
    if before is not None and newest is not None and step != newest:
        said += f" (not the newest checkpoint: {before.job} committed step {newest})"
    return said
