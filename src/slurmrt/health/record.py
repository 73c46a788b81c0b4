"""What the training's health left for the runs after it, in ``health.json`` beside the checkpoints: the newest
certified checkpoint, the unhealthy steps met and how often, the rewinds made to each certified step, and the steps
whose batches the loop skips (``rt.skip``).

Every rank holds the same record: rank 0 reads the file at the first load and every rank hears it; from then on each
rank changes its copy the same way (the checks are agreed), and rank 0 writes it. A file that is damaged, or not a
regular file (a link, a FIFO planted beside the checkpoints), is said and read as empty: it costs the protection of
one certified checkpoint, never a checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from .._safefs import read_capped, replace_text

__all__ = ["RECORD", "HealthRecord", "read_record", "write_record"]

logger = logging.getLogger(__name__)

RECORD = "health.json"
_LIMIT = 1 << 20  # far more than a record of thousands of faults


@dataclass
class HealthRecord:
    #: The newest checkpoint step that stayed healthy ``health_certify_after`` steps after it; None: none yet.
    certified: int | None = None
    #: step -> how many times it was found unhealthy (twice: reproducible).
    faults: dict[int, int] = field(default_factory=dict)
    #: certified step -> rewinds made to it.
    rewinds: dict[int, int] = field(default_factory=dict)
    #: (first, last) step ranges whose batches the loop skips, inclusive.
    skips: list[tuple[int, int]] = field(default_factory=list)
    #: step -> the nodes named at its first fault (one rank's values alone were bad), until its re-run says whether
    #: the fault was transient (then the nodes are left out) or comes back (the data or the model: they are not).
    suspects: dict[int, list[str]] = field(default_factory=dict)

    def skipped(self, step: int) -> bool:
        return any(first <= step <= last for first, last in self.skips)

    def to_json(self) -> str:
        return json.dumps({"certified": self.certified, "faults": {str(k): v for k, v in self.faults.items()},
                           "rewinds": {str(k): v for k, v in self.rewinds.items()},
                           "skips": [list(r) for r in self.skips],
                           "suspects": {str(k): v for k, v in self.suspects.items()}}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> HealthRecord:
        """The record of ``text``; ValueError (or a TypeError, KeyError) when it is not one."""
        d = json.loads(text)
        certified = d["certified"]
        if certified is not None:
            certified = _step(certified)
        return cls(certified, {_step(k): _step(v) for k, v in d["faults"].items()},
                   {_step(k): _step(v) for k, v in d["rewinds"].items()},
                   [_range(r) for r in d["skips"]],
                   {_step(k): _nodes(v) for k, v in d.get("suspects", {}).items()})  # a record of before suspects


def _step(value: Any) -> int:
    """A step or a count: a whole number >= 0 (a key comes as its text)."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a step")
    return value


def _nodes(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n and n.isprintable() for n in value):
        raise ValueError(f"{value!r} is not a list of node names")
    return value


def _range(value: Any) -> tuple[int, int]:
    first, last = (_step(v) for v in value)
    if first > last:
        raise ValueError(f"{value!r} is not a range of steps")
    return first, last


def read_record(root: Path | None) -> HealthRecord:
    """The record under ``root``; an empty one when there is none, or (said) when it is damaged or not a file."""
    if root is None:
        return HealthRecord()
    path = root / RECORD
    try:
        return HealthRecord.from_json(read_capped(path, _LIMIT).decode())
    except FileNotFoundError:
        return HealthRecord()
    except (OSError, SlurmrtError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as err:
        logger.warning("%s is not a record slurmrt wrote (%s): read as empty, so no checkpoint counts as certified "
                       "until one is again; remove or fix it", path, err)
        return HealthRecord()


def write_record(root: Path | None, record: HealthRecord) -> None:
    """Write the record under ``root`` (rank 0), whole or not at all; a failure is said, never raised (the training
    goes on; the next change writes it again)."""
    if root is None:
        return
    try:
        replace_text(root / RECORD, record.to_json())
    except OSError as err:
        logger.warning("%s could not be written (%s): the training's health record is kept in memory only",
                       root / RECORD, err)
