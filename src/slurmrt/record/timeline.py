"""The life of a job, from its event log: each run's steps over wall time, its checkpoints, why it stopped, the work
it lost, and the waits between runs. ``slurmrt status`` prints it (:mod:`.chart` draws it, in text or with
matplotlib).

Steps come from rank 0's events: ``resume``, ``progress`` (every ``progress_s``), ``save``, ``decision`` and
``exit``, which carries the last step the run reached (after its last checkpoint, when the loop ran on without a
save at its end). Work
lost by a run is the steps it trained after the checkpoint that the next run resumed from (for the last run: its
own last checkpoint). A run that ended without a clean exit (SIGKILL, a node failure) may have trained a few steps
after its last ``progress`` event; its lost work is a lower bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from .. import _figures as figures
from .._text import shorten
from .events import Event, stall, timestamp
from .inprocess import InProcessCost, in_process_cost, local_served
from .runs import Run, runs

__all__ = ["JobLife", "RunLife", "build", "counted"]


@dataclass
class RunLife:
    restart: int
    start: float
    end: float
    #: The in-job attempt (``slurmrt run``): 0, then one more for each step started after an in-job restart.
    attempt: int = 0
    #: The nodes this run's step left behind for an in-job restart, and why.
    left: tuple[str, ...] = ()
    left_why: str = ""
    #: The tier the resume read ("local", "shared"; None: not recorded, a run without a local tier), and the bytes
    #: its ranks received from other nodes' local tiers.
    resumed_tier: str | None = None
    from_peers: int | None = None
    #: Whether the local tier could serve the failure before this run: the resume read it, or it held a whole
    #: (older) checkpoint where the shared tier's was newer.
    local_served: bool = False
    #: `slurmrt run`'s judgement of this step's fault (its ``recovery`` event: class, evidence, action), or None.
    recovery: dict[str, Any] | None = None
    #: The stragglers this run named: "rank 3 on n2 (1.90x slower, 45 % of a step)".
    stragglers: tuple[str, ...] = ()
    #: The in-process restarts of this run (``slurmrt.run_restartable``), and a refusal: "rank 1's RuntimeError...".
    in_process: tuple[str, ...] = ()
    #: What the in-process restarts cost (:class:`InProcessCost`): counted once, here, for every reader.
    in_process_cost: InProcessCost = field(default_factory=InProcessCost)
    #: What ran (rank 0's ``init`` event: the script and its hash, git, argv, versions; :mod:`.code`), or None.
    code: dict[str, Any] | None = None
    #: (time, step) at each step the events name, in time order; the step only grows.
    points: list[tuple[float, int]] = field(default_factory=list)
    #: (commit time, step, seconds the save took)
    checkpoints: list[tuple[float, int, float]] = field(default_factory=list)
    #: (end, seconds) of each save's stall: the time it held training (a background save's too, before its write),
    #: never before the run's start. It is checkpoint stall, and no part of the lost work even when the save was
    #: not the one kept.
    stalls: list[tuple[float, float]] = field(default_factory=list)
    resumed_from: int | None = None
    #: Seconds its process ran before init() recorded it (interpreter, imports); ``start`` is that much earlier.
    process_s: float = 0.0
    #: When the fault of a run cut short (or left by an in-job restart) began: its first hang less the idle time the
    #: hang measured, else its last step. The lost work ends there, the recovery begins: the totals and the goodput
    #: ledger both count from it. None for a run that stopped or finished.
    fault_at: float | None = None
    #: The run reached its load (a resume or a fresh start); False: it ended in its start-up.
    loaded: bool = True
    stop_step: int | None = None
    reasons: tuple[str, ...] = ()
    outcome: str | None = None  # None: no clean exit was recorded
    last_step: int | None = None
    lost_steps: int = 0
    lost_s: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.restart}.{self.attempt}" if self.attempt else str(self.restart)

    @property
    def save_s(self) -> float:
        return sum(seconds for _, _, seconds in self.checkpoints)

    @property
    def last_checkpoint(self) -> int | None:
        return max((step for _, step, _ in self.checkpoints), default=None)

    @property
    def cut_short(self) -> bool:
        """The run ended without a clean exit (killed), or on a hang or a failed health check: its training was
        cut, so its last ``progress`` event is a lower bound of what it did."""
        return self.outcome in (None, "HUNG", "PEER_LOST", "UNHEALTHY")

    @property
    def stop_time(self) -> float | None:
        """When the run reached its stop step (its last recorded step when that one has no point)."""
        if self.stop_step is None or not self.points:
            return None
        return next((t for t, s in self.points if s == self.stop_step), self.points[-1][0])

    @property
    def lost_after(self) -> int | None:
        """The steps after this one were lost (None: nothing was)."""
        return self.last_step - self.lost_steps if self.lost_steps and self.last_step is not None else None


def counted(runs: int, in_job: int) -> str:
    """``2 run(s)``, or ``1 run(s) in 3 step(s)`` when ``in_job`` in-job restarts made new steps: the one way
    ``slurmrt status``, its totals and ``slurmrt sim``'s summary say a job's runs."""
    return f"{runs} run(s)" + (f" in {runs + in_job} step(s)" if in_job else "")


@dataclass
class JobLife:
    job: str
    experiment: str | None
    runs: list[RunLife]

    @property
    def job_runs(self) -> int:
        """The job's runs: what Slurm started, once and then once per requeue. The new step of an in-job restart
        (``slurmrt run``) is a step of its run, not a run of its own: ``runs`` holds one entry per step."""
        return len({r.restart for r in self.runs})

    @property
    def in_job_restarts(self) -> int:
        """The new steps in-job restarts started: every step after its run's first."""
        return sum(1 for r in self.runs if r.attempt)

    @property
    def gaps(self) -> list[float]:
        """Seconds between the end of each run and the start of the next: the queue, then the job's start-up."""
        return [max(0.0, b.start - a.end) for a, b in pairwise(self.runs)]

    @property
    def lost_steps(self) -> int:
        """Steps trained and lost: beyond the checkpoint a run's successor kept, and redone after in-process
        restarts."""
        return sum(r.lost_steps + r.in_process_cost.redone_steps for r in self.runs)

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s + r.in_process_cost.redone_s for r in self.runs)

    @property
    def in_process_restarts(self) -> int:
        return sum(r.in_process_cost.restarts for r in self.runs)

    @property
    def save_s(self) -> float:
        return sum(r.save_s for r in self.runs)

    @property
    def checkpoints(self) -> int:
        return sum(len(r.checkpoints) for r in self.runs)

    @property
    def wall_s(self) -> float:
        return self.runs[-1].end - self.runs[0].start if self.runs else 0.0

    @property
    def last_step(self) -> int | None:
        return max((r.last_step for r in self.runs if r.last_step is not None), default=None)


def build(events: Iterable[dict[str, Any]], job: str = "?") -> JobLife:
    grouped = runs(events)
    experiment = None
    lives = []
    for run in grouped:
        init = run.first(Event.INIT)
        if init is not None:
            job = str(init.get("job") or job)
            experiment = init.get("experiment") or experiment
        lives.append(_run_life(run))
    for before, life in pairwise(lives):  # a process start that would reach back into the run before (clocks)
        overlap = max(0.0, min(before.end - life.start, life.process_s))
        life.start, life.process_s = life.start + overlap, life.process_s - overlap
    for n, life in enumerate(lives):  # what survived a run is what the next run that loaded resumed from
        _account_lost(life, next((later for later in lives[n + 1:] if later.loaded), None))
    return JobLife(job=job, experiment=experiment, runs=lives)


def _straggler(e: dict[str, Any]) -> str:
    ratio, cost = e.get("ratio"), e.get("cost")
    numbers = [f"{ratio:.2f}x slower" if isinstance(ratio, (int, float)) else None,
               f"{cost:.0%} of a step" if isinstance(cost, (int, float)) else None]
    said = ", ".join(n for n in numbers if n)
    return f"rank {e.get('straggler')} on {e.get('node') or 'an unknown node'}" + (f" ({said})" if said else "")


def _in_process(e: dict[str, Any]) -> str:
    """An in-process restart (runtime/inprocess.py), or its refusal, in a few words."""
    error = str(e.get("error") or "an error").split(":")[0]
    step = f" after step {e['step']}" if isinstance(e.get("step"), int) else ""
    fault = f"rank {e.get('first_rank')}'s {error}{step}"
    if e.get("action") == "restart":
        back = figures.seconds(e.get("seconds"))
        return fault + (f", every rank back in {back:.2f} s" if back is not None else "")
    why = str(e.get("why") or "")
    return f"{fault} not restarted: " + shorten(why, 100)


def _run_life(run: Run) -> RunLife:
    # Shape: a run's life assembled from its events, one fact per line; each fact's reading is its own function
    moved = run.first(Event.IN_JOB_RESTART)
    process_s = _process_s(run)
    life = RunLife(restart=run.restart, start=run.start - process_s, end=run.end, resumed_from=run.resumed_from,
                   reasons=run.reasons, attempt=run.attempt, left=run.left_out or (),
                   left_why=str(moved.get("why") or "") if moved else "", process_s=process_s)
    life.recovery = run.first(Event.RECOVERY)
    ran = (run.first(Event.INIT) or {}).get("ran")
    life.code = ran if isinstance(ran, dict) else None
    life.stragglers = tuple(_straggler(e) for e in run.all(Event.STRAGGLER))
    life.in_process = tuple(_in_process(e) for e in run.all(Event.IN_PROCESS))
    life.in_process_cost = in_process_cost(run)
    life.resumed_tier, life.from_peers = _resumed_where(run)
    life.local_served = local_served(run.first_load)
    life.loaded = run.first(Event.RESUME) is not None or run.first(Event.FRESH_START) is not None
    _points(run, life)
    exit_event = run.exit
    life.outcome = exit_event.get("outcome") if exit_event else None
    if life.cut_short or life.left:
        life.fault_at = _fault_at(run, life)
    return life


def _fault_at(run: Run, life: RunLife) -> float:
    """When the run's fault began: the first hang less the idle time it measured (a lost peer: when it was found);
    without a hang event (a task killed), the training's last sign of life: its last event, ``slurmrt run``'s and
    ``slurmrt guard``'s records apart; never before the run's ``init``."""
    floor = life.start + life.process_s
    hangs = [timestamp(e) - (figures.seconds(e.get("idle_s")) or 0.0) for e in run.all(Event.HANG)]
    if hangs:
        return min(max(floor, min(hangs)), life.end)
    alive = [timestamp(e) for e in run.events if e.get("rank") != -1]
    return min(max([floor, *alive]), life.end)


def _points(run: Run, life: RunLife) -> None:
    """The run's (time, step) points, the step only growing, and its last step."""
    top = -1
    for t, step in sorted(_steps(run, life)):
        if step > top:  # a background save commits after later steps ran: it adds no progress
            life.points.append((t, step))
            top = step
    life.last_step = top if life.points else None


def _process_s(run: Run) -> float:
    """How long the run's process ran before its ``init`` event, when that event opens the run (a bounded
    duration), or, for a run's first step, since Slurm started the run (``slurm_start``, rank 0's: the batch
    script, the launcher and the process before ``init``), whichever is longer; else 0."""
    init = run.first(Event.INIT)
    if init is None or init is not run.events[0]:
        return 0.0
    own = figures.seconds(init.get("process_s")) or 0.0
    said = figures.epoch(next((e["slurm_start"] for e in run.all(Event.PROGRESS) if "slurm_start" in e), None))
    since = figures.seconds(run.start - said) if run.attempt == 0 and said is not None else None
    return max(own, since) if since is not None and since <= LAUNCH_MAX_S else own


def _resumed_where(run: Run) -> tuple[str | None, int | None]:
    """The tier the run resumed from, and the bytes it received from other nodes' local tiers (None: unknown)."""
    resume = run.first_load
    if resume is None or resume.get("event") != Event.RESUME.value:
        return None, None
    tier, peers = resume.get("tier"), resume.get("from_peers")
    return (tier if isinstance(tier, str) else None,
            peers if isinstance(peers, int) and not isinstance(peers, bool) else None)


#: A run's start more than this before its ``init`` (a damaged ``slurm_start``, a clock set by hand) is not believed.
LAUNCH_MAX_S = 86_400.0
_AT_STEP = (Event.RESUME.value, Event.PROGRESS.value, Event.DECISION.value, Event.EXIT.value, Event.SAVE.value)


def _steps(run: Run, life: RunLife) -> list[tuple[float, int]]:
    """(time, step) of every event that says where the run was; the checkpoints and the stop go into ``life``."""
    steps: list[tuple[float, int]] = []
    for e in run.events:
        kind, step = e.get("event"), e.get("step")
        if not isinstance(step, int) or kind not in _AT_STEP:
            continue
        at = timestamp(e)
        if kind == Event.SAVE.value:
            took, held, began = figures.seconds(e.get("seconds")) or 0.0, stall(e), _taken(e, at, life.start)
            if held is not None:  # from the save's call to its commit at most (an old log: back from the commit)
                ended, since = (min(at, began + held), began) if began < at else (at, life.start)
                life.stalls.append((ended, min(held, max(0.0, ended - since))))
            at = began
            life.checkpoints.append((at, step, took))
        steps.append((at, step))
        if kind == Event.DECISION.value:
            life.stop_step = step
    return steps


def _taken(save: dict[str, Any], committed: float, start: float) -> float:
    """When the run was at a save's step: its ``started`` (the save's call), not its commit, which a background
    save makes later, after any number of steps, or after a hang that froze it (a frozen step's time is not work a
    checkpoint kept). A log without it (or a value outside the run): the commit."""
    started = figures.epoch(save.get("started"))
    return started if started is not None and start <= started <= committed else committed


def _account_lost(life: RunLife, following: RunLife | None) -> None:
    """The steps ``life`` trained beyond what survived it, and the wall time they took."""
    if following is None and life.outcome == "FINISHED":
        return  # the last run did all its steps: what it trained after its last checkpoint is its result
    kept = _kept(life, following)
    if life.last_step is not None and life.last_step > kept:
        first_trained = life.resumed_from + 1 if life.resumed_from is not None else 0
        life.lost_steps = life.last_step - max(kept, first_trained - 1)
    if (life.lost_steps or life.cut_short) and life.points:  # a run that never trained lost no work
        life.lost_s = _lost_time(life, kept)


def _lost_time(life: RunLife, kept: int) -> float:
    """The wall time of the steps after ``kept``, the blocking saves among them apart (they are stall)."""
    # From the moment the run was at the kept step (the kept checkpoint's commit, when this run made it; else its
    # first step at or past it; none: nothing past it was trained) to its last step; for a run cut short, its fault.
    until = life.fault_at if life.fault_at is not None else life.points[-1][0]
    since = next((t for t, step, _ in life.checkpoints if step == kept), None)
    if since is None:
        since = next((t for t, step in life.points if step >= kept), until)
    return max(0.0, until - since - sum(s for t, s in life.stalls if since < t <= until))


def _kept(life: RunLife, following: RunLife | None) -> int:
    """The last step of ``life`` that survived it: where the next run resumed, else its newest checkpoint."""
    if following is not None:
        return following.resumed_from if following.resumed_from is not None else -1
    return max(life.last_checkpoint if life.last_checkpoint is not None else -1,
               life.resumed_from if life.resumed_from is not None else -1)
