"""What ``slurmrt run`` tells the step it runs: the job's times and the batch shell's warning signals, in a file.

``slurmrt run`` runs in the batch shell, where Slurm's commands are; the training may run inside a container
(Pyxis/enroot, Apptainer) that has none of them, a private ``/tmp`` and perhaps a process namespace of its own. So
what only the outside knows reaches the step through the supervisor's directory (on the filesystem every node and
the container see), not through ``squeue`` in the step or a signal sent to a pid:

- the job's start and end times, asked of Slurm by the supervisor (``squeue``) before each step and every
  ``end_time_refresh_s``: the deadline's input, one asker per job whatever the ranks;
- the warning signals the batch shell received (``--signal=B:USR1@120``), each with the time it came.

``word-<attempt>.json`` is replaced whole (written, then renamed) whenever it changes. The step's rank 0 reads it on
its watcher thread when its modification time changes (one ``stat`` a poll): the end time goes to the deadline, a
signal to the signal recorder as if it had arrived, and the agreement's next round carries either to every rank.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import UnsafePathError
from .._safefs import read_capped, replace_text
from ..stop.deadline import EndTime, end_time_from_env
from .facts import InJob

__all__ = ["Word", "WordReader", "listen", "read_word", "word_path", "write_word"]

logger = logging.getLogger(__name__)

_MAX_BYTES = 64 << 10


@dataclass
class Word:
    """The supervisor's word to one step."""

    #: When Slurm started this run of the job, and when it ends (epoch s); None: unknown or no limit.
    start: float | None = None
    end: float | None = None
    #: Signal name -> when the batch shell received it (epoch s).
    signals: dict[str, float] = field(default_factory=dict)


def word_path(directory: Path, attempt: int) -> Path:
    return directory / f"word-{attempt}.json"


def write_word(directory: Path, attempt: int, word: Word) -> None:
    """The supervisor's side: the file replaced whole."""
    replace_text(word_path(directory, attempt), json.dumps({"start": word.start, "end": word.end,
                                                            "signals": word.signals}) + "\n")


def read_word(path: Path) -> Word | None:
    """The word in ``path``; None when there is none, or it is not what slurmrt writes (said)."""
    try:
        data = json.loads(read_capped(path, _MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, UnsafePathError, ValueError, RecursionError) as err:
        logger.warning("%s: not read (%s): slurmrt run's word is ignored", path, err)
        return None
    word = _parse(data)
    if word is None:
        logger.warning("%s is not what slurmrt run writes: ignored", path)
    return word


def _parse(data: Any) -> Word | None:
    if not isinstance(data, dict) or not isinstance(data.get("signals"), dict):
        return None
    if not all(map(_time, (data.get("start"), data.get("end"), *data["signals"].values()))):
        return None
    if not all(name in signal.Signals.__members__ and t is not None for name, t in data["signals"].items()):
        return None
    return Word(data.get("start"), data.get("end"), {k: float(v) for k, v in data["signals"].items()})


def _time(value: Any) -> bool:
    """None, or epoch seconds as slurmrt run writes them."""
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


class WordReader:
    """The step's side, on rank 0's watcher thread: the times for the deadline (:meth:`times`, the end time's
    ``fetch``), the signals to ``record`` (:meth:`poll`), each new signal once."""

    def __init__(self, directory: Path, attempt: int, record: Callable[[signal.Signals, float], None]) -> None:
        self.path = word_path(directory, attempt)
        self._record = record
        self._seen: set[str] = set()
        self._stamp: tuple[int, int] | None = None
        self.word: Word | None = None

    def _read(self) -> Word | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return self.word  # not written yet, or the directory is gone with the supervisor: nothing new
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            self.word = read_word(self.path) or self.word
        return self.word

    def times(self, job_id: str) -> tuple[float | None, float | None]:
        """(start, end) as the supervisor last asked Slurm; (None, None) before it said. The word as :meth:`poll`
        last read it (the watcher calls both each turn: one ``stat``, not two); read here only before any poll."""
        word = self._read() if self._stamp is None else self.word
        return (word.start, word.end) if word is not None else (None, None)

    def poll(self) -> None:
        word = self._read()
        for name, at in (word.signals.items() if word is not None else ()):
            if name not in self._seen:
                self._seen.add(name)
                logger.info("%s: received by the batch shell, passed on by slurmrt run", name)
                self._record(signal.Signals[name], at)


def listen(in_job: InJob | None, record: Callable[[signal.Signals, float], None], env: Mapping[str, str], *,
           job_id: str | None, lead: bool, refresh_s: float) -> tuple[EndTime, WordReader | None]:
    """The job's end time (asked by rank 0, ``lead``), and rank 0's reader of ``slurmrt run``'s word (None
    elsewhere, and without ``slurmrt run``), from which the end time then comes."""
    word = WordReader(in_job.directory, in_job.attempt, record) if in_job is not None and lead else None
    if word is None:
        if lead and job_id is not None:
            _say_missing(env)
        return EndTime(env, job_id=job_id, ask=lead, refresh_s=refresh_s), word
    # The word is a file the supervisor refreshes (it asks Slurm every refresh_s): read at each watcher turn, a
    # changed time limit reaches the deadline at the supervisor's next ask, not up to refresh_s after it.
    return EndTime(env, job_id=job_id, ask=lead, refresh_s=0.0, fetch=word.times), word


def _end_time_known(env: Mapping[str, str]) -> bool:
    """Whether Slurm gave the job's end time in the environment (a malformed one counts: the deadline refuses it)."""
    try:
        return end_time_from_env(env) is not None
    except ValueError:
        return True


def _say_missing(env: Mapping[str, str]) -> None:
    """In a Slurm job whose step has none of Slurm's commands (a container) and no ``slurmrt run`` outside: what
    cannot work, said once."""
    missing = [c for c in ("squeue", "scontrol") if shutil.which(c) is None]
    lost = (["the job's end time is unknown (no save before the time limit unless --signal warns)"]
            if "squeue" in missing and not _end_time_known(env) else []) + \
        (["a requeue cannot be made"] if "scontrol" in missing else [])
    if lost:
        logger.warning("no %s here (a container without Slurm's commands?) and no `slurmrt run` outside: %s. Run the "
                       "training under `slurmrt run` in the batch script, which asks Slurm for it "
                       "(docs/guides/containers.md)", " or ".join(missing), "; ".join(lost))
