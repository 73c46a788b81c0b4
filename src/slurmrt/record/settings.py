"""What the job records, as options: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>``
variable (docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .._rules import Section, setting

__all__ = ["RecordSection"]


@dataclass(frozen=True, kw_only=True)
class RecordSection(Section):
    """What the job records: its event log, its experiment, its log lines, its goodput for Prometheus."""

    event_log: Path | None = setting(None, "path")
    #: The experiment id: by default the one stored next to the checkpoints (new for a fresh directory).
    experiment_id: str | None = setting(None, "value")
    #: slurmrt's own log lines (the ``slurmrt`` logger) get a handler of their own at init(): time, level and
    #: ``[host:rank]``, INFO on rank 0 and warnings on every rank, under the job's flock. Skipped when the program
    #: configured logging first (the root logger or ``slurmrt`` has a handler). False: never.
    log_handler: bool = setting(True, "flag")
    #: Rank 0 writes the job's goodput (``slurmrt status``'s ledger) here as OpenMetrics text at the end of each
    #: run, replaced whole: for Prometheus' textfile collector. None: not written.
    metrics_file: Path | None = setting(None, "path")
