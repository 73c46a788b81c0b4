"""The structured event log: its event names, the writer and the reader, in one place.

JSON lines, one file per job (array task) on the shared filesystem. Every line has ``time`` (ISO 8601, UTC),
``event`` (an :class:`Event` value), ``job``, ``restart`` and ``rank``; the rest depends on the event. Lines are
appended under an exclusive ``flock`` on the file itself, so that writers on several nodes never interleave.
``slurmrt status`` and the simulator's summary read it back as runs (:mod:`slurmrt.record.runs`).
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import _clock
from .. import _figures as figures
from .._errors import UnsafePathError
from .._safefs import NotOwnError, lock, open_append, open_regular

__all__ = ["COPY_ENV", "Event", "EventFollower", "EventLog", "malformed", "read_events", "stall", "timestamp"]

logger = logging.getLogger(__name__)

#: Set by ``slurmrt sim`` (a process-boundary variable): every event is also appended to this file, so the
#: simulator can follow the job (its summary, ``--after-checkpoint``) wherever the job keeps its own event log.
COPY_ENV = "SLURMRT_EVENT_COPY"
#: How long a writer waits for the event log's lock (held by a writer for one line, so a longer hold is not ours).
LOCK_TIMEOUT_S = 10.0
#: No event is near this long: a longer line is skipped, read in pieces of this size (memory stays bounded).
MAX_LINE = 1 << 20
#: The most a follower reads at once.
MAX_READ = 64 << 20


class Event(str, enum.Enum):
    """Every event slurmrt writes. Rank 0 writes all but ``SIGNAL``, which each rank writes for itself."""

    INIT = "init"  # mode, world_size, nnodes, nodelist, master, restart_count, kill_switch, experiment, ran (what ran)
    SIGNAL = "signal"  # signal, received, count; stalled, or after (the peers srun saw end): said at INFO
    PROGRESS = "progress"  # step, step_s, once slurm_start (rank 0, every progress_s)
    DECISION = "decision"  # step, reasons, save, end_time, step_s, save_s, worst_step_s
    # step, seconds, bytes, blocking, path, started (the save's call: the training at its step), tier ("local"; absent:
    # the shared tier)
    SAVE = "save"
    SAVE_SKIPPED = "save_skipped"  # step, save_s
    RESUME = "resume"  # step, seconds; with a local tier: tier, from_peers, local_held
    FRESH_START = "fresh_start"
    REQUEUE = "requeue"  # done, message, restart_count
    # code, outcome, why, reasons, step (the last step the run reached; null when unknown), action (the plan's), exclude
    EXIT = "exit"
    PHASE = "phase"  # name, seconds (rank 0, at the end of each rt.phase)
    HANG = "hang"  # activity, idle_s, allowed_s, step, where, stacks (every rank that found itself stuck)
    SUSPECTS = "suspects"  # suspects [{rank, node, where, step}], nodes, why (the census leader)
    EXCLUDE = "exclude"  # nodes, added, refused, message
    CRASH = "crash"  # error (a rank whose program ended on an exception of its own: a software error, not a node)
    HEALTH = "health"  # ok, failed [what], node (a rank whose node failed the health check)
    IN_JOB_RESTART = "in_job_restart"  # nodes, spares, why, next_attempt (`slurmrt run` starts a step without nodes)
    # generation, action ("restart", "refused"), rank (the first to fail), error, step, why, fault_time, seconds
    # (rt.run_restartable: the training function raised; it runs again in the same processes, or the run ends)
    IN_PROCESS = "in_process"
    IN_JOB_REFUSED = "in_job_refused"  # nodes, why (no in-job restart: the requeue takes over)
    # trigger, evidence [{node, in_job, failures, hangs_before, class}], class, action, kept, left_out, why
    # (`slurmrt run`'s judgement of a failed step, one per attempt)
    RECOVERY = "recovery"
    GUARD = "guard"  # guard (its job id), batch_host, message (`slurmrt run` armed the guard job; `guard` ran it)
    STRAGGLER = "straggler"  # step, straggler (rank), node, ratio, cost, window, slow_s, others_s, step_s, action
    # step, what ("nonfinite", "spike", "replicas"), first_rank, why, action (rerun, rewind, end), certified, rung,
    # suspects (the nodes named when one rank's values alone were bad) (rt.check)
    TRAINING_HEALTH = "training_health"
    CERTIFIED = "certified"  # step (the checkpoint), at (the healthy step that certified it)
    # step, nodes (its re-run passed: the nodes that computed it wrong, none when every rank did), left_out (a restart
    # leaves them out; false: no restart could, training went on and the ledger has them)
    TRANSIENT_FAULT = "transient_fault"


class EventLog:
    def __init__(self, path: Path | None, *, job: str | None, restart: int, rank: int,
                 copy: Path | None = None, attempt: int = 0) -> None:
        self.path = path
        self._base: dict[str, Any] = {"job": job, "restart": restart, "rank": rank}
        if attempt:  # a step started in the same run by `slurmrt run` after an in-job restart
            self._base["attempt"] = attempt
        self._paths = [p for p in dict.fromkeys((path, copy)) if p is not None]
        self._made: set[Path] = set()  # directories known to exist: no mkdir per event
        self._unlocked: set[Path] = set()  # logs whose lock someone else held for LOCK_TIMEOUT_S

    @classmethod
    def for_job(cls, path: Path | None, directory: Path | None, *, job: str | None, restart: int, rank: int,
                env: Mapping[str, str], attempt: int = 0) -> EventLog:
        """The job's event log: ``path`` when given, else ``events-<job>.jsonl`` (``events-local.jsonl`` outside
        Slurm) in the checkpoint directory; none without either. ``slurmrt sim`` asks for a copy (COPY_ENV)."""
        if path is None and directory is not None:
            path = directory / f"events-{job or 'local'}.jsonl"
        return cls(path, job=job, restart=restart, rank=rank,
                   copy=Path(env[COPY_ENV]) if env.get(COPY_ENV) else None, attempt=attempt)

    def emit(self, event: Event, *, durable: bool = True, **data: Any) -> None:
        """Append one event under the file's lock. ``durable``: fsync before returning (what the job's story rests
        on: decisions, saves, exits); a sample that the next one replaces (``progress``) skips it, so the training
        thread that writes it never waits for the disk."""
        if not self._paths:
            return
        stamp = datetime.fromtimestamp(_clock.wall(), tz=timezone.utc).isoformat(timespec="milliseconds")
        line = json.dumps({"time": stamp, "event": event.value, **self._base, **data}, default=str)
        for path in list(self._paths):
            try:
                if path.parent not in self._made:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self._made.add(path.parent)
                fd = open_append(path, own=True)  # a symlink or another user's file is refused, not followed
                try:
                    # Anyone who can read the file can lock it: a bounded wait, then the line goes in unlocked
                    # (one O_APPEND write) rather than the training waiting on another user's lock.
                    if path not in self._unlocked and not lock(fd, timeout_s=LOCK_TIMEOUT_S):
                        self._unlocked.add(path)
                        logger.warning("event log %s stayed locked for %.0f s (not by a writer of ours): writing "
                                       "without the lock from now on", path, LOCK_TIMEOUT_S)
                    os.write(fd, (line + "\n").encode("utf-8"))
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)  # releases the lock
            except UnsafePathError as err:  # it will not change: said once, and the log goes on without it
                self._paths.remove(path)
                logger.warning("event log %s is not written (%s)", path, err)
            except OSError as err:  # the log must never take the training down
                logger.warning("cannot write event log %s: %s", path, err)


def read_events(path: Path, *, own: bool = False) -> Iterator[dict[str, Any]]:
    """The well-formed events of the log at ``path``, in order. A line that is not JSON (a write cut short), not an
    object, or whose fields have the wrong types (:func:`malformed`) is skipped with a warning: every reader
    (``slurmrt status``, ``doctor``, the simulator's summary, the loop guard) may then trust the fields it reads.
    ``own``: a reader that decides from the log (the loop guard, the deadline, the cadence) believes only a log of
    this user's own; another user's is ignored, with one warning that names it."""
    clock = _Monotonic(path)
    try:
        fd = open_regular(path, own=own)
    except NotOwnError as err:
        logger.warning("%s", err)
        return
    held: tuple[dict[str, Any], int] | None = None  # each event waits for the next: its time is judged by both
    for event, number in _well_formed(fd, path):
        if held is not None:
            yield clock.ordered(*held, following=event)
        held = event, number
    if held is not None:
        yield clock.ordered(*held, following=None)


def _well_formed(fd: int, path: Path) -> Iterator[tuple[dict[str, Any], int]]:
    """The log's events that :func:`malformed` accepts, with their line numbers; the others said and skipped."""
    with os.fdopen(fd, "rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE), b""), 1):
            if len(raw) >= MAX_LINE and not raw.endswith(b"\n"):
                logger.warning("%s:%d is longer than %d bytes, far longer than any event: skipped", path, number,
                               MAX_LINE)
                while raw and not raw.endswith(b"\n"):  # the rest of that line, in bounded pieces
                    raw = f.readline(MAX_LINE)
                continue
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                logger.warning("%s:%d is not JSON (a write cut short?); skipped", path, number)
                continue
            problem = malformed(event)
            if problem:
                logger.warning("%s:%d is not a slurmrt event (%s); skipped", path, number, problem)
                continue
            yield event, number


class _Monotonic:
    """The events of a log in the order they were appended (under its lock), with times that never run backwards:
    a wall clock that stepped back (NTP, a VM resumed, a node whose clock is behind) would give negative durations.
    Each event's time is judged against both its neighbours. One dated after the event written after it (by more
    than a second) while that one follows the event before it is the one that is off (a host whose clock is ahead,
    a line written by hand): it takes its neighbours' time, so one line dated hours ahead does not stretch its run
    to that date. An event dated before the one written before it takes that one's time. The first of each, by more
    than a second, is said once, naming its own line."""

    def __init__(self, path: Path) -> None:
        self.path, self.latest, self.said = path, float("-inf"), False

    def ordered(self, event: dict[str, Any], number: int, *, following: dict[str, Any] | None) -> dict[str, Any]:
        if "time" not in event:
            return event
        when = datetime.fromisoformat(event["time"])
        stamp = when.timestamp()
        after = _stamp(following)
        if stamp < self.latest:
            self._say(number, f"is dated {self.latest - stamp:.0f} s before the event written before it (a clock "
                              "that stepped back?): taken at that event's time", self.latest - stamp)
        elif after is not None and stamp - after > 1.0 and after >= self.latest - 1.0:
            self._say(number, f"is dated {stamp - after:.0f} s after the event written after it (a clock ahead?): "
                              "taken at its neighbours' time", stamp - after)
            stamp = max(self.latest, after)
        else:
            self.latest = stamp
            return event
        self.latest = max(self.latest, stamp)
        moved = datetime.fromtimestamp(self.latest, tz=when.tzinfo)  # naive stays naive (local time)
        return {**event, "time": moved.isoformat()}

    def _say(self, number: int, what: str, by: float) -> None:
        if by > 1.0 and not self.said:
            self.said = True
            logger.warning("%s:%d %s", self.path, number, what)


def _stamp(event: dict[str, Any] | None) -> float | None:
    """The epoch time of an event (already checked by :func:`malformed`), None without one."""
    return None if event is None or "time" not in event else datetime.fromisoformat(event["time"]).timestamp()


def _reasons(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(r, str) for r in value)


#: Each field's type, when present and not null: (fields, test, what it must be).
_FIELDS: tuple[tuple[tuple[str, ...], Any, str], ...] = (
    (("restart", "attempt", "step", "count", "bytes", "world_size", "nnodes", "job_nodes", "from_peers", "straggler",
      "generation"),
     lambda v: figures.count(v) is not None,
     f"a whole number from 0 to {figures.MAX_COUNT}"),
    (("rank", "first_rank"), lambda v: figures.count(v, -1) is not None, "a rank (-1 or more)"),
    (("code",), lambda v: figures.count(v, -255) is not None, "an exit code"),
    (("seconds", "step_s", "save_s", "worst_step_s", "idle_s", "allowed_s", "process_s", "stall"),
     lambda v: figures.seconds(v) is not None, f"a duration (finite, 0 to {figures.MAX_SECONDS:.0f} s)"),
    (("end_time", "fault_time"), lambda v: figures.epoch(v) is not None,
     "a time (seconds since the epoch, before 2200)"),
    (("ratio", "cost"), lambda v: figures.ratio(v) is not None, f"a ratio (finite, 0 to {figures.MAX_RATIO:g})"),
    (("job", "outcome", "name", "experiment", "why", "signal"), lambda v: isinstance(v, str), "a string"),
    (("reasons",), _reasons, "a list of names"),
)


#: An event dated further ahead than this was not written by a clock of this job (two hosts' clocks differ by
#: seconds): it would stretch the ledger's wall time to its date.
FUTURE_S = 86400.0


def malformed(event: Any) -> str | None:
    """Why ``event`` is not one slurmrt wrote (the first field of the wrong type), or None when it is well formed."""
    # Shape: the first wrong field wins: the checks in order, each returning its reason
    if not isinstance(event, dict):
        return f"a JSON {type(event).__name__}, not an object"
    if not isinstance(event.get("event"), str):
        return "no \"event\" name"
    if "time" in event:  # every event slurmrt writes has one; runs() leaves out the events without
        try:
            when = datetime.fromisoformat(event["time"]).timestamp()
        except (TypeError, ValueError, OverflowError, OSError):
            return f"time {event['time']!r} is not ISO 8601"
        if figures.epoch(when) is None or when > _clock.wall() + FUTURE_S:
            return f"time {event['time']!r} is not between 1970 and a day from now"
    for names, test, what in _FIELDS:
        for name in names:
            if event.get(name) is not None and not test(event[name]):
                return f"{name} {event[name]!r} is not {what}"
    return None


class EventFollower:
    """Reads the events appended to a log since the last call, as a writer adds them (``tail -f``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""

    def new(self) -> list[dict[str, Any]]:
        try:
            with os.fdopen(open_regular(self.path), "rb") as f:
                f.seek(self._offset)
                text = f.read(MAX_READ).decode("utf-8", errors="replace")
                self._offset = f.tell()
        except (FileNotFoundError, UnsafePathError):
            return []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next read
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue  # an empty line, or one cut short by a killed writer
            if malformed(event) is None:
                out.append(event)
        return out


def timestamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def stall(save: dict[str, Any]) -> float | None:
    """The seconds a ``save`` event's save held the training: its ``stall``; in a log written before it was
    recorded, a blocking save's ``seconds`` (a background save's are its write, behind the training: None)."""
    held = figures.seconds(save.get("stall"))
    if held is None and save.get("blocking") is True:
        held = figures.seconds(save.get("seconds"))
    return held
