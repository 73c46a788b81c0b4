"""The options of ``rt.check``: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>`` variable
(docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections, and the composer hands this
one to the health check.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._rules import Section, setting

__all__ = ["HealthSection"]


@dataclass(frozen=True, kw_only=True)
class HealthSection(Section):
    """What makes a step's loss a spike (far above the median of the recent healthy ones), when a checkpoint is
    certified, and how often a fault may rewind to it."""

    #: The recent healthy losses a spike is judged against (at least 20 of them before any is judged).
    health_window: int = setting(100, "count", least=20)
    #: A spike is this many robust deviations (1.4826 x the median absolute deviation) above the window's median ...
    spike_sigmas: float = setting(10.0, "fraction")
    #: ... and at least this fraction of the median above it (0.5: 50 % higher), so that a flat loss's tiny
    #: deviation does not make noise a spike.
    spike_margin: float = setting(0.5, "fraction")
    #: A checkpoint is certified once the training stayed healthy (every ``rt.check``) this many steps after it:
    #: retention never deletes the newest certified one, and a fault that comes back rewinds to it.
    health_certify_after: int = setting(50, "count", least=1)
    #: Rewinds to the same certified checkpoint before the run ends, naming the checkpoint to start from (0: a fault
    #: that comes back ends the run at once).
    health_max_rewinds: int = setting(3, "count", least=0)
    #: With ``rt.check(..., replicas=model)``: the steps between two comparisons of the data-parallel replicas'
    #: hashes (one all-gather of one integer per rank, and a pass over the parameters' bytes).
    health_hash_every: int = setting(100, "count", least=1)
