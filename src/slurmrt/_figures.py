"""Every kind of figure slurmrt reads back or is given, parsed and bounded in one place.

JSON lets a record hold ``NaN``, ``Infinity`` and ``1e999`` (Python reads all three as floats), and an option's text
can be 400 digits long: none of them is a duration, a time or a count, and each ended in a traceback somewhere
(``int(nan)``, ``math.ceil(inf)``, ``1 / 1e-400``). A figure from a record (an event log, the bad-node ledger, the
run directory) that is out of bounds makes the record malformed: it is skipped with one warning. An option out of
bounds is refused with one line (:mod:`slurmrt.options`). JSON that slurmrt writes never holds a non-finite number
(:func:`finite_json`).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_COUNT", "MAX_EPOCH", "MAX_HOURS", "MAX_RATIO", "MAX_SECONDS", "count", "epoch", "finite_json", "ratio",
           "seconds"]

#: The longest duration any figure may be: a hundred years (a save, a step, a wait; 1e9 s is how an option says
#: "never").
MAX_SECONDS = 100 * 365 * 86400.0
#: Wall times (seconds since the epoch) up to the year 2200: a time past it is a forged record or a broken clock.
MAX_EPOCH = 7_258_118_400.0
#: Counts (steps, ranks, restarts, bytes, exit codes): what a float still holds exactly.
MAX_COUNT = 2**53
#: A ratio or a share.
MAX_RATIO = 1e6
#: A mean time between failures, in hours (the ``mtbf_node_h`` option): at most a million (114 years).
MAX_HOURS = 1e6


def _between(value: Any, low: float, high: float) -> float | None:
    """``value`` as a float when it is a finite number from ``low`` to ``high`` (not a flag, not a 400-digit int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int of 400 digits
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def seconds(value: Any) -> float | None:
    """A duration: a finite number from 0 to :data:`MAX_SECONDS`; None otherwise."""
    return _between(value, 0.0, MAX_SECONDS)


def epoch(value: Any) -> float | None:
    """A wall time in seconds since the epoch, up to :data:`MAX_EPOCH`; None otherwise."""
    return _between(value, 0.0, MAX_EPOCH)


def ratio(value: Any) -> float | None:
    """A ratio or a share (a straggler's slowness, a cost in steps): finite, from 0 to :data:`MAX_RATIO`."""
    return _between(value, 0.0, MAX_RATIO)


def count(value: Any, low: int = 0) -> int | None:
    """A whole number from ``low`` to :data:`MAX_COUNT` (not a flag, not a float); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= MAX_COUNT else None


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, for JSON that is RFC 8259 (no NaN, no Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
