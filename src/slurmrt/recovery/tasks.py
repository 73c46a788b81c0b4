"""What srun says about the step's tasks, as it says it: a task that ends before the step does is known at once.

srun learns within milliseconds that one of its tasks ended, and says so on its standard error
(``srun: error: n2: task 1: Killed``, ``srun: error: n3: tasks 4-7: Exited with exit code 1``). ``slurmrt run`` reads
srun's standard error through a pipe, passes every byte on unchanged and as it comes (a progress bar's ``\\r`` is not
held back), and writes the tasks that ended to the run directory (:func:`slurmrt.recovery.injob.write_ended`). The
step's ranks read it there while they take the census after a lost peer: nobody waits for a dead rank's answer.

A task's own output reaches srun's standard error too: a program that prints a line of this form itself names a task
that did not end. Task ids outside the step are ignored.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import IO

from . import injob

__all__ = ["TASK_ENDED", "StepOutput", "parse_ended"]

#: srun's line for tasks that ended: the node, the task ids (``1``, ``4-7``, ``0,2``), how they ended.
TASK_ENDED = re.compile(r"^srun: error: (?P<node>[A-Za-z0-9._-]+): tasks? (?P<ids>[0-9][0-9,\-]*): (?P<how>.+?)\s*$")
#: The longest line kept to be read (what the line holds is passed on whatever its length).
_LINE_MAX = 4096


def parse_ended(line: str, ntasks: int) -> dict[int, tuple[str, str]]:
    """The tasks that ``line`` says ended (task id: node, how), ids within the step's ``ntasks``; none for any other
    line."""
    found = TASK_ENDED.match(line)
    if found is None:
        return {}
    ids: set[int] = set()
    for part in found["ids"].split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return {}
        first, last = int(low), int(high or low)
        ids.update(range(first, min(last, ntasks - 1) + 1))
    return {t: (found["node"], found["how"]) for t in sorted(ids) if t < ntasks}


class StepOutput(threading.Thread):
    """Passes srun's standard error (``source``, a pipe) on to ``sink`` and records the tasks that ended in
    ``directory`` for step ``attempt``. Ends when srun closes the pipe."""

    def __init__(self, source: IO[bytes], sink: int, directory: Path, attempt: int, ntasks: int) -> None:
        super().__init__(name="slurmrt-step-output", daemon=True)
        self._source, self._sink = source, sink
        self.directory, self.attempt, self.ntasks = directory, attempt, ntasks
        #: Task id: (node, how), and when this supervisor read it (monotonic).
        self.ended: dict[int, tuple[str, str]] = {}
        self.seen: dict[int, float] = {}

    def run(self) -> None:
        fd, partial = self._source.fileno(), b""
        while chunk := _read(fd):
            _write_all(self._sink, chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            partial = partial[-_LINE_MAX:]
            self._note(lines)

    def _note(self, lines: list[bytes]) -> None:
        new: dict[int, tuple[str, str]] = {}
        for line in lines:
            if line.startswith(b"srun: error: "):
                new.update(parse_ended(line[:_LINE_MAX].decode(errors="replace"), self.ntasks))
        new = {t: v for t, v in new.items() if t not in self.ended}
        if new:
            now = time.monotonic()
            self.ended.update(new)
            self.seen.update(dict.fromkeys(new, now))
            injob.write_ended(self.directory, self.attempt, self.ended)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    """Everything, or nothing more once the sink is gone (the job's output file closed): srun must never block."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return
