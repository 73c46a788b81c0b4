"""Slurm hostlist expressions: ``n[001-003,7]`` <-> ``n001 n002 n003 n7``.

The grammar follows what ``scontrol show hostnames`` accepts on Slurm 22.05 (measured, see docs/slurm.md):

- entries are separated by commas or whitespace outside brackets; empty entries are skipped;
- a bracket holds comma-separated ``N`` or ``LO-HI``; the width of ``LO`` pads every number (``n[01-10]``);
- several bracket groups form a product; the last group varies fastest, then the first, second, ... group
  (``n[1-2]-[3-4]-[5-6]`` -> n1-3-5 n1-3-6 n2-3-5 n2-3-6 n1-4-5 ...), which is Slurm's order, not lexicographic;
- text after the last bracket (``n[1-3]x``) is invalid, and so is a range of more than 65536 hosts.

Where scontrol prints garbage instead of an error (``n[1-2`` gives ``n]``), this module raises :class:`HostlistError`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from .._errors import HostlistError

__all__ = ["compress", "expand"]

#: scontrol refuses a single range of more hosts than this ("Too many hosts in range").
MAX_RANGE = 65536

_SEPARATORS = frozenset(", \t\n")
# [0-9], not \d, which also matches other scripts' digits ("n[١-٢]"): Slurm reads ASCII digits only.
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TRAILING_NUMBER = re.compile(r"^(.*?)([0-9]+)$", re.DOTALL)


def expand(expr: str) -> list[str]:
    """Return the hosts named by a Slurm hostlist expression, in Slurm's order."""
    hosts: list[str] = []
    for entry in _split_entries(expr):
        hosts.extend(_expand_entry(entry, expr))
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """Return a hostlist expression for ``hosts`` that :func:`expand` turns back into the same list.

    Like ``scontrol show hostlist``, order is kept: only neighbouring hosts that share a prefix share a bracket, and
    only consecutive numbers of the same padding share a range (``n3,n1,n2`` -> ``n[3,1-2]``).
    """
    # Shape: a single pass with a pending bracket (flush): order is kept, neighbours share a bracket
    out: list[str] = []
    group_prefix: str | None = None
    ranges: list[list[int | str]] = []  # [lo_digits, lo, hi]

    def flush() -> None:
        if group_prefix is None:
            return
        single = len(ranges) == 1 and ranges[0][1] == ranges[0][2]
        if single:
            out.append(f"{group_prefix}{ranges[0][0]}")
        else:
            # scontrol writes both ends with the first one's width: n009,n010,n011 -> n[009-011], not n[009-11].
            parts = [str(lo_d) if lo == hi else f"{lo_d}-{hi:0{len(str(lo_d))}d}" for lo_d, lo, hi in ranges]
            out.append(f"{group_prefix}[{','.join(parts)}]")

    for host in hosts:
        if not host or any(c in _SEPARATORS or c in "[]" for c in host):
            raise HostlistError(
                f"cannot compress host name {host!r}: host names must be non-empty and contain no brackets, "
                "commas or whitespace",
                host=host,
            )
        match = _TRAILING_NUMBER.match(host)
        if match is None:
            flush()
            group_prefix, ranges = None, []
            out.append(host)
            continue
        prefix, digits = match.group(1), match.group(2)
        number = int(digits)
        if prefix == group_prefix:
            lo_digits, _, hi = ranges[-1]
            assert isinstance(lo_digits, str) and isinstance(hi, int)
            # A range renders every number with the width of its first one, so only extend it when that
            # rendering reproduces this host exactly (n09,n10 -> n[09-10]; n08,n9 stay apart).
            if number == hi + 1 and f"{number:0{len(lo_digits)}d}" == digits:
                ranges[-1][2] = number
            else:
                ranges.append([digits, number, number])
            continue
        flush()
        group_prefix, ranges = prefix, [[digits, number, number]]
    flush()
    return ",".join(out)


def _split_entries(expr: str) -> list[str]:
    # Shape: a character scanner with one depth flag: each character's case in one place
    entries: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expr:
        if char == "[":
            if depth:
                raise HostlistError(f"invalid hostlist {expr!r}: nested '['", expression=expr)
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"invalid hostlist {expr!r}: ']' without a matching '['", expression=expr)
            depth = 0
        elif char in _SEPARATORS and not depth:
            if current:
                entries.append("".join(current))
            current = []
            continue
        current.append(char)
    if depth:
        raise HostlistError(f"invalid hostlist {expr!r}: '[' is never closed", expression=expr)
    if current:
        entries.append("".join(current))
    return entries


def _expand_entry(entry: str, expr: str) -> list[str]:
    if "[" not in entry:
        return [entry]
    texts: list[str] = []  # literal text before each bracket group
    groups: list[list[str]] = []
    rest = entry
    while "[" in rest:
        before, _, tail = rest.partition("[")
        body, _, rest = tail.partition("]")
        texts.append(before)
        groups.append(_expand_ranges(body, entry, expr))
    if rest:
        raise HostlistError(
            f"invalid hostlist {expr!r}: text {rest!r} after the last bracket of {entry!r} "
            "(Slurm allows a suffix only between bracket groups)",
            expression=expr,
            entry=entry,
        )
    if len(groups) == 1:  # nearly every real nodelist: one bracket group
        prefix = texts[0]
        return [prefix + value for value in groups[0]]
    # Slurm's order: the last group varies fastest, then groups 1, 2, ... k-1 like an odometer from the left.
    head = groups[:-1]
    hosts = []
    for combo in itertools.product(*reversed(head), groups[-1]):
        values = [*reversed(combo[:-1]), combo[-1]]
        hosts.append("".join(text + value for text, value in zip(texts, values, strict=True)))
    return hosts


def _expand_ranges(body: str, entry: str, expr: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise HostlistError(
                f"invalid hostlist {expr!r}: range {part!r} in {entry!r} is not N or LO-HI with decimal numbers",
                expression=expr,
                range=part,
            )
        lo_digits, hi_digits = match.group(1), match.group(2)
        lo = int(lo_digits)
        hi = lo if hi_digits is None else int(hi_digits)
        if hi < lo:
            raise HostlistError(
                f"invalid hostlist {expr!r}: range {part!r} in {entry!r} runs backwards (LO must be <= HI)",
                expression=expr,
                range=part,
            )
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(
                f"invalid hostlist {expr!r}: range {part!r} names {hi - lo + 1} hosts; Slurm allows at most "
                f"{MAX_RANGE} in one range",
                expression=expr,
                range=part,
            )
        width = len(lo_digits)
        if width == 1:
            values.extend(map(str, range(lo, hi + 1)))
        else:
            values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values
