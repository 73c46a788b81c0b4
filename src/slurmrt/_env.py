"""Reading typed values out of an environment mapping, with errors that name the variable."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._errors import EnvironmentVariableError

# [0-9], not \d: \d also matches other scripts' digits ("٣"), which Slurm never writes.
_TASKS_PER_NODE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_INTEGER = re.compile(r"-?[0-9]+")


def get_int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    """``int(env[name])``, ``None`` when absent, :class:`EnvironmentVariableError` when malformed."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    if _INTEGER.fullmatch(raw) is None:  # int() would also take "1_0", " 3" and non-ASCII digits
        raise EnvironmentVariableError(
            f"{name}={raw!r} is not an integer; Slurm and torchrun always set it to one. Unset it, or check the "
            "sbatch script for an export that overwrote it",
            variable=name,
            value=raw,
        )
    value = int(raw)
    if value < minimum:
        raise EnvironmentVariableError(
            f"{name}={raw!r} must be >= {minimum}; unset it, or fix the export that set it", variable=name, value=raw
        )
    return value


def first_int(env: Mapping[str, str], *names: str, minimum: int = 0) -> tuple[str, int] | None:
    """The first of ``names`` that is set, as ``(name, value)``."""
    for name in names:
        value = get_int(env, name, minimum=minimum)
        if value is not None:
            return name, value
    return None


def first_str(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value:
            return name, value
    return None


def parse_tasks_per_node(name: str, raw: str) -> list[int]:
    """Expand Slurm's tasks-per-node string: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    matches = [_TASKS_PER_NODE.fullmatch(part) for part in raw.split(",")]
    if not all(matches):
        raise EnvironmentVariableError(
            f"{name}={raw!r} is not a Slurm tasks-per-node list such as '2(x3),1'", variable=name, value=raw,
        )
    return [int(m.group(1)) for m in matches if m for _ in range(int(m.group(2) or 1))]


def format_tasks_per_node(counts: list[int]) -> str:
    """Inverse of :func:`parse_tasks_per_node`, as Slurm writes it (``[2, 2, 1]`` -> ``2(x2),1``)."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(str(counts[i]) if j - i == 1 else f"{counts[i]}(x{j - i})")
        i = j
    return ",".join(parts)


def truthy(raw: str | None) -> bool:
    return raw is not None and raw.strip().lower() in {"1", "true", "yes", "on"}
