"""What the ranks agree on: the reasons to stop, one rank's contribution to a round, and the decision.

:func:`contribution` turns what this rank has seen (signals, the kill switch, the deadline budget) into its part of
a round; :mod:`slurmrt.stop.agreement` reduces the parts of every rank into one :class:`StopDecision`.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .deadline import Budget
from .straggler import Timing

__all__ = ["Contribution", "ContributeFn", "Reason", "StopDecision", "contribution", "decode", "encode"]


class Reason(enum.Enum):
    """Why a run stops. Ordered from the mildest to the most final."""

    STRAGGLER = "straggler"  # straggler="replace": a slow node is left out at a restart (slurmrt.stop.straggler)
    SUSPECT = "suspect"  # a node computed a step wrong once (rt.check): left out at a restart, and into the ledger
    SIGNAL = "signal"  # the --signal warning (USR1/USR2 by default): time is nearly up, or preemption is coming
    DEADLINE = "deadline"  # no signal, but the next steps plus a save would run past the job's end time
    TERM = "sigterm"  # time limit, preemption or scancel
    INTERRUPT = "sigint"  # Ctrl-C, or `scancel --signal=INT`
    KILL_SWITCH = "kill_switch"  # someone created the kill-switch file


_REASONS = tuple(Reason)
_NONE = -(2**62)


@dataclass(frozen=True)
class Contribution:
    """What one rank knows at one round."""

    reasons: frozenset[Reason] = frozenset()
    step: int = -1
    window: int = 2
    end_time: float | None = None
    term_time: float | None = None
    save_unfit: bool = False
    #: This rank left its training loop (its last step is done): the rounds end.
    leaving: bool = False
    #: This rank's last window of timed sections (reduced: the slowest rank, the slowest elsewhere), for stragglers.
    timing: Timing = Timing()


@dataclass(frozen=True)
class StopDecision:
    """The agreed stop: the same object on every rank."""

    step: int
    reasons: frozenset[Reason]
    #: False when SIGTERM came and the measured save time does not fit before SIGKILL.
    save: bool
    end_time: float | None = None
    term_time: float | None = None

    @property
    def reason(self) -> Reason:
        """The most final of the reasons."""
        return max(self.reasons, key=_REASONS.index)


def encode(c: Contribution) -> list[int]:
    """A MAX all-reduce of these integers is the union of reasons, the max step, the earliest SIGTERM, ..."""
    return [
        *(int(r in c.reasons) for r in _REASONS),
        c.step,
        c.window,
        int(c.end_time) if c.end_time is not None else _NONE,
        -int(c.term_time * 1000) if c.term_time is not None else _NONE,  # max of -t is -(min t)
        int(c.save_unfit),
        int(c.leaving),
        *c.timing.encode(),
    ]


def decode(values: list[int]) -> Contribution:
    n = len(_REASONS)
    flags, (step, window, end, neg_term, unfit, leaving), timing = values[:n], values[n:n + 6], values[n + 6:]
    return Contribution(
        reasons=frozenset(r for r, f in zip(_REASONS, flags, strict=True) if f),
        step=step,
        window=window,
        end_time=float(end) if end != _NONE else None,
        term_time=-neg_term / 1000 if neg_term != _NONE else None,
        save_unfit=bool(unfit),
        leaving=bool(leaving),
        timing=Timing.decode(timing),
    )


ContributeFn = Callable[[int, int, "float | None"], Contribution]
"""(last step reached, steps that may still run before a stop, agreed end time) -> this rank's contribution."""


def reason_for(sig: signal.Signals) -> Reason:
    if sig is signal.SIGTERM:
        return Reason.TERM
    if sig is signal.SIGINT:
        return Reason.INTERRUPT
    return Reason.SIGNAL


def contribution(*, now: float, step: int, steps_ahead: int, signals: Mapping[signal.Signals, float],
                 kill_switch_seen: bool, own_end: float | None, agreed_end: float | None, budget: Budget,
                 deadline: bool, straggler: bool = False, suspect: bool = False,
                 timing: Timing = Timing()) -> Contribution:
    """This rank's part of a round: ``signals`` maps each signal seen to its first arrival (wall time); ``own_end``
    is the end time this rank knows itself, ``agreed_end`` the one the ranks agreed on so far."""
    reasons = {reason_for(sig) for sig in signals}
    if kill_switch_seen:
        reasons.add(Reason.KILL_SWITCH)
    if straggler:
        reasons.add(Reason.STRAGGLER)
    if suspect:
        reasons.add(Reason.SUSPECT)
    if deadline and budget.deadline_near(now=now, end=own_end or agreed_end, steps_ahead=steps_ahead):
        reasons.add(Reason.DEADLINE)
    term = signals.get(signal.SIGTERM)
    unfit = term is not None and not budget.save_fits_after_term(now=now, term_time=term, steps_ahead=steps_ahead)
    return Contribution(frozenset(reasons), step, 2, own_end, term, unfit, timing=timing)
