"""The structured event log: JSON lines, one file per job (array task) on the shared filesystem.

Every line has ``time`` (ISO 8601, UTC), ``event``, ``job``, ``restart`` and ``rank``; the rest depends on the event
(init, signal, decision, save, requeue, exit). ``slurmrt status`` reads it. Lines are appended under a file lock so
that writers on several nodes never interleave.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from . import _clock

__all__ = ["COPY_ENV", "EventLog", "read_events"]

logger = logging.getLogger(__name__)


#: Set by ``slurmrt sim`` (a process-boundary variable): every event is also appended to this file, so the
#: simulator can follow the job (its summary, ``--after-checkpoint``) wherever the job keeps its own event log.
COPY_ENV = "SLURMRT_EVENT_COPY"


class EventLog:
    def __init__(self, path: Path | None, *, job: str | None, restart: int, rank: int,
                 copy: Path | None = None) -> None:
        self.path = path
        self._base = {"job": job, "restart": restart, "rank": rank}
        self._paths = [p for p in dict.fromkeys((path, copy)) if p is not None]

    def emit(self, event: str, **data: Any) -> None:
        if not self._paths:
            return
        stamp = datetime.fromtimestamp(_clock.wall(), tz=timezone.utc).isoformat(timespec="milliseconds")
        line = json.dumps({"time": stamp, "event": event, **self._base, **data}, default=str, sort_keys=False)
        for path in self._paths:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with FileLock(f"{path}.lock"), open(path, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as err:  # the log must never take the training down
                logger.warning("cannot write event log %s: %s", path, err)


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d is not JSON (a write cut short?); skipped", path, number)
