"""``slurmrt sim``: a local stand-in for Slurm that behaves like the real one (docs/slurm.md).

- :mod:`.job`: the job, its runs one after another; :mod:`.runner`: one run (its time limit, signals, faults).
- :mod:`.faults` and :mod:`.trace`: faults drawn or read, and played into the runs (on the job's or the training
  clock).
- :mod:`.shims`, :mod:`.srun`, :mod:`.environ`: Slurm's commands and environment as the job sees them;
  :mod:`.state`, :mod:`.summary`, :mod:`.guards`, :mod:`.throttle`, :mod:`.processes`, :mod:`.jobids`, :mod:`.spec`:
  the rest.
"""

from __future__ import annotations

from .job import RunRecord, simulate
from .spec import JobSpec

__all__ = ["JobSpec", "RunRecord", "simulate"]
