"""The experiment's failure history, read from its event log, for ``rt.should_save`` (:mod:`.cadence`): the time
its runs and in-job attempts ran, the failures that cut them, and which of those the local tier served."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["OWN_RATE_FROM", "SHARED_SHARE_PRIOR", "History"]

#: The share of failures the local tier is assumed not to serve, until the history says (weight: one failure).
SHARED_SHARE_PRIOR = 0.5
#: From this many failures of its own, the job's own failure rate wins over the prior where it is shorter.
OWN_RATE_FROM = 1


@dataclass(frozen=True)
class History:
    """The experiment's failures before this run: seconds run, failures, and of those, the ones whose next run did
    not resume from the local tier."""

    exposure_s: float = 0.0
    failures: int = 0
    shared_failures: int = 0

    @classmethod
    def of(cls, events: Iterable[dict[str, Any]], *, current: tuple[int, int] | None = None) -> History:
        """From the event log's events; ``current``: this run's (restart, attempt), left out (it has not ended),
        but the tier it resumed from still says whether the local tier served the failure before it."""
        from ..record.timeline import build

        lives = build(events).runs
        exposure, failures, shared = 0.0, 0, 0
        for life, following in zip(lives, [*lives[1:], None], strict=True):
            if (life.restart, life.attempt) == current:
                continue
            exposure += max(0.0, life.end - life.start)
            if life.cut_short or life.left:
                failures += 1
                shared += following is None or not following.local_served
            cost = life.in_process_cost  # the faults the run lived through: failures as much as a requeue's
            failures += cost.restarts
            shared += cost.restarts - cost.from_local
        return cls(exposure, failures, shared)

    def mtbf_s(self, *, node_h: float, nodes: int) -> float:
        """Mean time between failures of the job: its history, with a prior of one failure in ``node_h`` node-hours
        over ``nodes`` nodes; from ``OWN_RATE_FROM`` failures, its own rate where that is shorter."""
        with_prior = (node_h * 3600 / max(1, nodes) + self.exposure_s) / (1 + self.failures)
        own = self.own_s()
        return min(with_prior, own) if own is not None else with_prior

    def own_s(self) -> float | None:
        """The job's own mean time between failures (time run over failures), once it has seen
        ``OWN_RATE_FROM`` failure(s); else None."""
        return max(self.exposure_s, 1.0) / self.failures if self.failures >= OWN_RATE_FROM else None

    def lasting(self, seconds: float) -> History:
        """This history with ``seconds`` more run without a failure (the current run, so far)."""
        return replace(self, exposure_s=self.exposure_s + max(0.0, seconds))

    def failing(self, count: int, *, local: bool) -> History:
        """This history with ``count`` more failures, served by the local tier if ``local``."""
        return replace(self, failures=self.failures + count,
                       shared_failures=self.shared_failures + (0 if local else count))

    def shared_share(self) -> float:
        """The share of failures the local tier did not serve."""
        return (SHARED_SHARE_PRIOR + self.shared_failures) / (1 + self.failures)
