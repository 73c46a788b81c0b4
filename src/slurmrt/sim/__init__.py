"""``slurmrt sim``: a local stand-in for Slurm that behaves like the real one (docs/slurm.md)."""

from __future__ import annotations

from .job import RunRecord, simulate
from .spec import JobSpec

__all__ = ["JobSpec", "RunRecord", "simulate"]
