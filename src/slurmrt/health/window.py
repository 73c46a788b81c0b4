"""One rank's judgement of one step's values: a loss or a gradient norm that is not finite, or a loss that spikes.

Pure. A spike is judged against the recent healthy losses only (a value judged unhealthy never joins them), with a
robust rule: above the median by ``spike_sigmas`` robust deviations (1.4826 x the median absolute deviation, the
standard deviation of normal noise) and by ``spike_margin`` of the median. A falling loss is never a spike: the rule
looks up only. Until ``MIN_HISTORY`` healthy losses are held, only non-finite values are judged. The limit is
computed again every ``REFRESH`` healthy losses (a median and a median deviation of up to ``health_window`` values:
tens of microseconds), and read in between: it lags the loss by at most that many steps.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from .settings import HealthSection

__all__ = ["MIN_HISTORY", "REFRESH", "LossWindow", "Verdict"]

#: Healthy losses held before a spike is judged at all.
MIN_HISTORY = 20
#: Healthy losses between two computations of the limit.
REFRESH = 10
#: The median absolute deviation of normal noise is this fraction of its standard deviation.
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Verdict:
    """Why a step is unhealthy: ``what`` is ``"nonfinite"`` or ``"spike"``, ``why`` says the values."""

    what: str
    why: str


@dataclass
class LossWindow:
    settings: HealthSection
    losses: deque[float] = field(default_factory=deque)
    _limit: float | None = None
    _added: int = 0  #: healthy losses since the limit was computed

    def judge(self, loss: float | None, grad_norm: float | None = None) -> Verdict | None:
        """This step's verdict (None: healthy); a healthy loss joins the window."""
        for name, value in (("loss", loss), ("grad_norm", grad_norm)):
            if value is not None and not math.isfinite(value):
                return Verdict("nonfinite", f"{name} is {value}")
        if loss is None:
            return None
        limit = self.limit()
        if limit is not None and loss > limit:
            median = statistics.median(self.losses)
            return Verdict("spike", f"loss {loss:.6g} is above {limit:.6g} (the median of the last "
                                    f"{len(self.losses)} healthy losses is {median:.6g})")
        self.losses.append(loss)
        self._added += 1
        while len(self.losses) > self.settings.health_window:
            self.losses.popleft()
        return None

    def limit(self) -> float | None:
        """The loss above which a step is a spike, or None while too few healthy losses are held."""
        if len(self.losses) < MIN_HISTORY:
            return None
        if self._limit is None or self._added >= REFRESH:
            median = statistics.median(self.losses)
            sigma = _MAD_TO_SIGMA * statistics.median(abs(v - median) for v in self.losses)
            s = self.settings
            self._limit, self._added = median + max(s.spike_sigmas * sigma, s.spike_margin * abs(median)), 0
        return self._limit
