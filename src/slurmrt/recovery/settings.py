"""The recovery policy's options: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>`` variable
(docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections, and the recovery's
:class:`~slurmrt.recovery.facts.Facts` hold this one whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._rules import Section, setting

__all__ = ["RecoverySection"]


@dataclass(frozen=True, kw_only=True)
class RecoverySection(Section):
    """The recovery's policy: whether and how often the job comes back, and how many nodes it may leave out."""

    requeue: bool = setting(True, "flag")
    max_restarts: int | None = setting(None, "count", optional=True)
    #: Stop requeueing after this many runs in a row committed no newer checkpoint. None: never stop.
    max_futile_runs: int | None = setting(3, "count", least=1, optional=True)
    #: At most this many nodes excluded from the job by slurmrt, over all its runs.
    max_excluded_nodes: int = setting(4, "count")
