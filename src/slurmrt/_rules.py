"""How an option's value is checked: each option's field carries its :class:`Rule` (:func:`setting`), and
:func:`convert` is the one place every option, given in code or as ``SLURMRT_<NAME>``, is validated.

Each part's package declares its options in a :class:`Section` of its own (``checkpoint/settings.py``,
``stop/settings.py``, ...); :class:`slurmrt.options.Options` composes them. Below every package: a section's rules
and the signals' names need nothing of slurmrt's above the standard helpers.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from . import _figures as figures
from ._errors import ConfigError
from ._safefs import group_id

__all__ = ["Rule", "Section", "convert", "parse_signal", "rule_of", "setting"]

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_NONE = {"none", "off", "never"}
#: Signals a process cannot catch: a recorder for them would never run.
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
_S = TypeVar("_S", bound="Section")


@dataclass(frozen=True)
class Rule:
    """What values an option takes: a ``kind`` (path, count, seconds, hours, flag, choice, fraction, signals, group,
    argv, value), the least number (count, seconds, hours), the words of a choice, and whether "none"/"off"/"never"
    is a value (no limit, no milestones, no fixed allowance, no progress events)."""

    kind: str
    least: float = 0
    optional: bool = False
    choices: tuple[str, ...] = ()


def setting(default: Any, kind: str, *, least: float = 0, optional: bool = False, choices: tuple[str, ...] = (),
            factory: Any = None) -> Any:
    """A section's field: its default and the rule its values follow, said once."""
    rule = {"rule": Rule(kind, least, optional, choices)}
    if factory is not None:
        return field(default_factory=factory, metadata=rule)
    return field(default=default, metadata=rule)


def rule_of(cls: type, name: str) -> Rule:
    """The rule of option ``name`` among the fields of ``cls`` (a section, or the options composed of them)."""
    return next(f.metadata["rule"] for f in fields(cls) if f.name == name)


class Section:
    """A part's options (a frozen dataclass of :func:`setting` fields), declared once in its package; the composer
    picks it from the whole with :meth:`of` and hands it to the part (the composers hold the whole; a part never
    does)."""

    @classmethod
    def of(cls: type[_S], whole: object) -> _S:
        return cls(**{f.name: getattr(whole, f.name) for f in fields(cls)})  # type: ignore[arg-type]


def parse_signal(value: str | int | signal.Signals) -> signal.Signals:
    """``"USR1"``, ``"SIGUSR1"``, ``10`` or ``signal.SIGUSR1`` -> ``signal.SIGUSR1``."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return signal.Signals(int(value))
    name = value.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {value!r}; use a name such as USR1 or TERM") from None


def convert(name: str, rule: Rule, value: Any) -> Any:
    """``value`` (an argument, or the text of ``SLURMRT_<NAME>``) as option ``name`` takes it, checked.
    :class:`ConfigError` naming the value, the rule and the fix."""
    try:
        return _parse(name, rule, value)
    except (TypeError, ValueError, OverflowError) as err:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:40] + f"... ({len(repr(value))} characters)"
        raise ConfigError(f"option {name}={shown} is invalid: {err}", option=name, value=value) from None


def _parse(name: str, rule: Rule, value: Any) -> Any:
    text = value.strip().lower() if isinstance(value, str) else None
    if rule.optional and text in _NONE:
        return None
    return _PARSERS[rule.kind](rule, value, text)


def _path(rule: Rule, value: Any, text: str | None) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError("an empty path would be the current directory; give a path, or leave the option unset")
    return Path(os.path.expanduser(str(value)))


def _count(rule: Rule, value: Any, text: str | None) -> int:
    if isinstance(value, (bool, float)) or (text is not None and not text.lstrip("-").isdigit()):
        raise ValueError("not a whole number")
    number = int(value)
    if not rule.least <= number <= figures.MAX_COUNT:
        raise ValueError(f"must be at least {rule.least:g} and at most {figures.MAX_COUNT}")
    return number


def _seconds(rule: Rule, value: Any, text: str | None) -> float:
    unit, most = ("hours", figures.MAX_HOURS) if rule.kind == "hours" else ("seconds", figures.MAX_SECONDS)
    if isinstance(value, bool):
        raise ValueError(f"not a number of {unit}")
    seconds = float(value)
    if not math.isfinite(seconds) or not rule.least <= seconds <= most:
        raise ValueError(f"{unit}, at least {rule.least:g} and at most {most:g}, finite" + (
            " (or 'none')" if rule.optional else ""))
    return seconds


def _flag(rule: Rule, value: Any, text: str | None) -> bool:
    if isinstance(value, bool):
        return value
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("use 1/true/yes/on or 0/false/no/off (an unknown word must not turn a protection off)")


def _choice(rule: Rule, value: Any, text: str | None) -> str:
    if text not in rule.choices:
        raise ValueError(f"use one of {', '.join(rule.choices)}")
    return text


def _fraction(rule: Rule, value: Any, text: str | None) -> float:
    if isinstance(value, bool):
        raise ValueError("not a number")
    number = float(value)
    if not math.isfinite(number) or not 0.01 <= number <= 100:
        raise ValueError("a fraction between 0.01 and 100 (0.25: 25 % slower)")
    return number


def _signals(rule: Rule, value: Any, text: str | None) -> tuple[signal.Signals, ...]:
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    signals = tuple(parse_signal(s) for s in items)
    caught = sorted(s.name for s in signals if s in _UNCATCHABLE)
    if caught:
        raise ValueError(f"{', '.join(caught)} cannot be caught by any process; use USR1, USR2, TERM or INT")
    return signals


def _group(rule: Rule, value: Any, text: str | None) -> str:
    group = str(value).strip()
    group_id(group)  # ValueError when the node knows no such group
    return group


def _argv(rule: Rule, value: Any, text: str | None) -> tuple[str, ...]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(str(a) for a in value)
    return tuple(str(value).split())


_PARSERS = {"path": _path, "count": _count, "seconds": _seconds, "hours": _seconds, "flag": _flag,
            "choice": _choice, "fraction": _fraction, "signals": _signals, "group": _group, "argv": _argv,
            "value": lambda rule, value, text: value}
