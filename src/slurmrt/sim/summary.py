"""What ``slurmrt sim`` tells about the job: each run's record, the events it follows while the job runs, and the
summary table at the end."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .._errors import SlurmrtError
from ..record.events import Event, EventFollower
from ..record.inprocess import in_process_cost
from ..record.runs import Run, runs
from ..record.timeline import counted

__all__ = ["RunRecord", "ledger", "summary"]


@dataclass
class RunRecord:
    restart: int
    seconds: float = 0.0
    ended_by: str = ""
    exit_code: int | None = None
    requeued: bool = False
    reasons: tuple[str, ...] = ()
    checkpoint: int | None = None
    resumed_from: int | None = None
    #: Whether a step of the run loaded (resumed, or started fresh); one killed in its start-up did not.
    loaded: bool = True
    #: The exit code slurmrt chose for the run (its event log's ``exit``): 3 for a stop and requeue, even when the
    #: requeue then ended the tasks before they could exit with it, as Slurm's requeue does.
    chosen_code: int | None = None
    #: Exit status of each task of the run's largest step, by rank (negative: ended by that signal).
    task_codes: dict[int, int] = field(default_factory=dict)
    #: The run's in-job restarts (``slurmrt run``): the nodes each new step left out.
    in_job: list[tuple[str, ...]] = field(default_factory=list)
    #: The stragglers the run named: (rank, node).
    stragglers: list[tuple[int, str | None]] = field(default_factory=list)
    #: The in-process restarts of the run (``slurmrt.run_restartable``), as ``slurmrt status`` counts them.
    in_process: int = 0
    #: The steps ``rt.check`` found unhealthy in the run (its ``training_health`` events).
    unhealthy_steps: int = 0
    #: The rehearsed faults (preempt, cancel, fail, hang) that never fired in this run, and why.
    missed: list[str] = field(default_factory=list)
    #: Seconds from the run's start to its first checkpoint, when the faults counted from it (--after-checkpoint).
    anchor_s: float | None = 0.0


class _Follow:
    """Follows the events the job appends to the simulator's copy: which runs committed a checkpoint (what
    --after-checkpoint waits for), and, on a terminal, the progress of the run (its step, its last checkpoint)."""

    def __init__(self, path: Path, progress: Callable[[str], None] | None = None) -> None:
        self._follower = EventFollower(path)
        self._saved: dict[int, int] = {}  # restart -> its last committed step
        #: restart -> (the starts of its steps so far, the step of rank 0's newest report since the last start)
        self._training: dict[int, tuple[int, int | None]] = {}
        self._finished: set[int] = set()  # the runs whose training finished (an exit event FINISHED)
        self._progress = progress
        self._next_read = 0.0

    def poll(self, *, final: bool = False) -> None:
        # Shape: one pass over new events, one case per kind that changes what the simulator knows
        now = time.monotonic()
        if now < self._next_read and not final:
            return
        self._next_read = now + 0.1
        for event in self._follower.new():
            kind, restart, step = event.get("event"), int(event.get("restart", 0)), event.get("step")
            if kind == Event.SAVE.value and isinstance(step, int):
                self._saved[restart] = step
            self._clock(kind, restart, step)
            if kind == Event.EXIT.value and event.get("outcome") == "FINISHED":
                self._finished.add(restart)
            if self._progress is not None and kind in (Event.PROGRESS.value, Event.DECISION.value):
                last = self._saved.get(restart)
                stopping = f" -- stopping: {', '.join(event.get('reasons', []))}" if kind == "decision" else ""
                self._progress(f"run {restart}: step {step}, last checkpoint "
                               f"{'none' if last is None else f'step {last}'}{stopping}")

    def _clock(self, kind: object, restart: int, step: object) -> None:
        """The training clock after one event: a start (fresh or a resume) restarts its count, a report sets it."""
        starts, _ = self._training.get(restart, (0, None))
        if kind in (Event.RESUME.value, Event.FRESH_START.value):
            self._training[restart] = (starts + 1, None)
        elif kind == Event.PROGRESS.value and isinstance(step, int):
            self._training[restart] = (starts, step)

    def training(self, restart: int) -> tuple[int, int | None]:
        """The training clock of run ``restart``: how many times it started (in-job restarts count), and the step
        rank 0 last reported since the newest start (None: none yet)."""
        return self._training.get(restart, (0, None))

    def finished(self, restart: int) -> bool:
        """True once run ``restart`` has trained all its steps (as of the last poll): a fault after it changes
        nothing a user would rehearse."""
        return restart in self._finished

    def saved(self, restart: int) -> bool:
        """True once run ``restart`` has committed a checkpoint (as of the last poll)."""
        return restart in self._saved


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _began(steps: list[Run]) -> tuple[bool, int | None]:
    """Whether a run of the job loaded, and the step it resumed from (None: a fresh start): its first step that
    loaded says (a step killed in its start-up loaded nothing)."""
    loaded = [s for s in steps if s.first(Event.RESUME) is not None or s.first(Event.FRESH_START) is not None]
    return bool(loaded), (loaded or steps)[0].resumed_from


def _annotate(records: list[RunRecord], events: list[dict[str, Any]]) -> None:
    """Each run's story from the event log; a run of the job made of several steps (in-job restarts) reads as the
    resume of its first step that loaded, and its last step's end."""
    # Shape: each run's story, one fact per line, from its steps' events
    by_restart: dict[int, list[Run]] = {}
    for run in runs(events):
        by_restart.setdefault(run.restart, []).append(run)
    for rec in records:
        steps = by_restart.get(rec.restart)
        if not steps:
            continue
        last = steps[-1]
        exit_event = last.exit
        rec.reasons = last.reasons
        rec.checkpoint = next((s.last_checkpoint for s in reversed(steps) if s.last_checkpoint is not None), None)
        rec.loaded, rec.resumed_from = _began(steps)
        rec.chosen_code = exit_event.get("code") if exit_event else None
        rec.in_job = [step.left_out or () for step in steps[:-1]]  # each step a new one followed, as status says
        for step in steps:
            rec.stragglers += [(int(e.get("straggler", -1)), e.get("node")) for e in step.all(Event.STRAGGLER)]
            rec.in_process += in_process_cost(step).restarts
            rec.unhealthy_steps += len(step.all(Event.TRAINING_HEALTH))


def _status(code: int) -> str:
    return f"SIG{signal.Signals(-code).name[3:]}" if code < 0 and -code in signal.valid_signals() else str(code)


def summary(records: list[RunRecord], after: list[str] | None = None) -> str:
    """One row per run, then the lines ``after`` (what a fault trace did, the goodput ledger). ``ended by`` says
    how the run ended (the time limit, a preemption...); ``exit`` is the code
    slurmrt chose (3: stopped and requeued); ``tasks`` how the training processes really ended, and ``batch`` the
    batch shell: a requeue or the time limit ends them with signals, as Slurm does."""
    rows: list[tuple[str, ...]] = [("run", "duration", "ended by", "exit", "tasks", "batch", "stop reasons",
                                    "checkpoint", "resumed from")]
    rows += [_row(r) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(["", "slurmrt sim summary", *lines, "", _counts(records), *([""] + after if after else [])])


def _counts(records: list[RunRecord]) -> str:
    """The runs, and the recoveries and faults in them, counted once as ``slurmrt status`` counts them."""
    in_job = sum(len(r.in_job) for r in records)
    in_process = sum(r.in_process for r in records)
    unhealthy = sum(r.unhealthy_steps for r in records)
    return (f"{counted(len(records), in_job)}: {max(0, len(records) - 1)} requeue(s), {in_job} in-job restart(s)"
            + (f", {in_process} in-process restart(s)" if in_process else "")
            + (f"; {unhealthy} unhealthy step(s) found by rt.check" if unhealthy else ""))


def ledger(events: Path | None) -> list[str]:
    """The goodput ledger of the job (``slurmrt status``'s), when it wrote events."""
    from ..record.events import read_events
    from ..record.goodput import account

    if events is None or not events.exists():
        return []
    ledger = account(read_events(events))
    return ledger.lines() if ledger.wall_s > 0 else []


def _row(r: RunRecord) -> tuple[str, ...]:
    codes = sorted(set(r.task_codes.values()), key=lambda c: (c < 0, c))
    return (
        str(r.restart),
        f"{r.seconds:.1f} s",
        _ended_by(r),
        "-" if r.chosen_code is None else str(r.chosen_code),
        ",".join(_status(c) for c in codes) or "-",
        "-" if r.exit_code is None else _status(r.exit_code),
        ", ".join(r.reasons) or "-",
        "-" if r.checkpoint is None else f"step {r.checkpoint}",
        ("fresh start" if r.resumed_from is None else f"step {r.resumed_from}") if r.loaded else "-",
    )


def _ended_by(r: RunRecord) -> str:
    ended = r.ended_by + (" (requeued)" if r.requeued else "")
    if r.in_job:  # the new steps `slurmrt run` started inside this run
        ended += "; in-job restart(s) " + ", ".join(f"without {'+'.join(nodes)}" if nodes else "on the same nodes"
                                                    for nodes in r.in_job)
    if r.stragglers:
        ended += "; straggler " + ", ".join(f"rank {rank} on {node or '?'}" for rank, node in r.stragglers)
    return ended


def missed_faults(faults: list[tuple[float, str]], fired: set[str], *, anchored: bool) -> list[str]:
    """The rehearsed faults that never fired, each with why: a rehearsal that did not happen must not look like one
    that was survived. ``anchored``: the faults' clock started (with --after-checkpoint, at the first checkpoint)."""
    missed = sorted({what for _, what in faults if what != "preempt_term"} - fired)
    why = ("no checkpoint was committed, and --after-checkpoint counts from the first one (give the job a checkpoint "
           "directory and a save before then)" if not anchored else "the run ended before its moment")
    return [f"{what}: {why}" for what in missed]


def tidy(directory: Path, records: list[RunRecord], out: IO[str], *, interrupted: bool) -> None:
    """The simulator's own state directory (a temporary one): removed when the job finished cleanly, so that a
    rehearsal leaves nothing behind; kept, and named, when something is worth a look."""
    last = records[-1] if records else None
    if last is not None and last.exit_code == 0 and last.ended_by == "finished" and not interrupted:
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"slurmrt sim: its state is kept in {directory}", file=out, flush=True)


class SimInterrupted(SlurmrtError):
    """The simulator itself got SIGINT, SIGTERM or SIGHUP; the job was ended and nothing is left running."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"slurmrt sim got signal {signum}", signum=signum)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:
        return (SimInterrupted, (self.signum,))
