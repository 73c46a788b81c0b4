"""The life of a job, from its event log: each run's steps over wall time, its checkpoints, why it stopped, the work
it lost, and the waits between runs. ``slurmrt status`` prints it, and draws it with matplotlib when asked.

Steps come from rank 0's events: ``resume``, ``progress`` (every ``progress_s``), ``save``, ``decision`` and
``exit``, which carries the last step the run reached (after its last checkpoint, when the loop ran on without a
save at its end). Work
lost by a run is the steps it trained after the checkpoint that the next run resumed from (for the last run: its
own last checkpoint). A run that ended without a clean exit (SIGKILL, a node failure) may have trained a few steps
after its last ``progress`` event; its lost work is a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from .events import Event, Run, runs, timestamp

__all__ = ["JobLife", "RunLife", "build", "draw", "duration", "render", "totals"]


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
    #: `slurmrt run`'s judgement of this step's fault (its ``recovery`` event: class, evidence, action), or None.
    recovery: dict[str, Any] | None = None
    #: The stragglers this run named: "rank 3 on n2 (1.90x slower, 45 % of a step)".
    stragglers: tuple[str, ...] = ()
    #: (time, step) at each step the events name, in time order; the step only grows.
    points: list[tuple[float, int]] = field(default_factory=list)
    #: (commit time, step, seconds the save took)
    checkpoints: list[tuple[float, int, float]] = field(default_factory=list)
    resumed_from: int | None = None
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
        return self.outcome in (None, "HUNG", "UNHEALTHY")

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


@dataclass
class JobLife:
    job: str
    experiment: str | None
    runs: list[RunLife]

    @property
    def gaps(self) -> list[float]:
        """Seconds between the end of each run and the start of the next: the queue, then the job's start-up."""
        return [max(0.0, b.start - a.end) for a, b in pairwise(self.runs)]

    @property
    def lost_steps(self) -> int:
        return sum(r.lost_steps for r in self.runs)

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s for r in self.runs)

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
    for n, life in enumerate(lives):  # what survived a run is what the next run that loaded resumed from
        _account_lost(life, next((later for later in lives[n + 1:] if later.loaded), None))
    return JobLife(job=job, experiment=experiment, runs=lives)


def _straggler(e: dict[str, Any]) -> str:
    ratio, cost = e.get("ratio"), e.get("cost")
    numbers = [f"{ratio:.2f}x slower" if isinstance(ratio, (int, float)) else None,
               f"{cost:.0%} of a step" if isinstance(cost, (int, float)) else None]
    said = ", ".join(n for n in numbers if n)
    return f"rank {e.get('straggler')} on {e.get('node') or 'an unknown node'}" + (f" ({said})" if said else "")


def _with_next(lives: list[RunLife]) -> list[tuple[RunLife, RunLife | None]]:
    """Each run with the one after it (None for the last)."""
    return list(zip(lives, [*lives[1:], None], strict=True)) if lives else []


def _run_life(run: Run) -> RunLife:
    moved = run.first(Event.IN_JOB_RESTART)
    life = RunLife(restart=run.restart, start=run.start, end=run.end, resumed_from=run.resumed_from,
                   reasons=run.reasons, attempt=run.attempt,
                   left=tuple(str(n) for n in moved.get("nodes") or ()) if moved else (),
                   left_why=str(moved.get("why") or "") if moved else "")
    _judgement(run, life)
    life.stragglers = tuple(_straggler(e) for e in run.all(Event.STRAGGLER))
    life.resumed_tier, life.from_peers = _resumed_where(run)
    life.loaded = run.first(Event.RESUME) is not None or run.first(Event.FRESH_START) is not None
    top = -1
    for t, step in sorted(_steps(run, life)):
        if step > top:  # a background save commits after later steps ran: it adds no progress
            life.points.append((t, step))
            top = step
    life.last_step = top if life.points else None
    exit_event = run.first(Event.EXIT)
    life.outcome = exit_event.get("outcome") if exit_event else None
    return life


def _judgement(run: Run, life: RunLife) -> None:
    """`slurmrt run`'s judgement of the step's fault, and so the nodes it really left out (the ranks named
    suspects; the evidence may have cleared them)."""
    life.recovery = run.first(Event.RECOVERY)
    if life.recovery is not None:
        life.left = tuple(str(n) for n in life.recovery.get("left_out") or ())


def _resumed_where(run: Run) -> tuple[str | None, int | None]:
    """The tier the run resumed from, and the bytes it received from other nodes' local tiers (None: unknown)."""
    resume = run.first(Event.RESUME)
    if resume is None:
        return None, None
    tier, peers = resume.get("tier"), resume.get("from_peers")
    return (tier if isinstance(tier, str) else None,
            peers if isinstance(peers, int) and not isinstance(peers, bool) else None)


_AT_STEP = (Event.RESUME.value, Event.PROGRESS.value, Event.DECISION.value, Event.EXIT.value, Event.SAVE.value)


def _steps(run: Run, life: RunLife) -> list[tuple[float, int]]:
    """(time, step) of every event that says where the run was; the checkpoints and the stop go into ``life``."""
    steps: list[tuple[float, int]] = []
    for e in run.events:
        kind, step = e.get("event"), e.get("step")
        if not isinstance(step, int) or kind not in _AT_STEP:
            continue
        steps.append((timestamp(e), step))
        if kind == Event.SAVE.value:
            life.checkpoints.append((steps[-1][0], step, float(e.get("seconds") or 0.0)))
        if kind == Event.DECISION.value:
            life.stop_step = step
    return steps


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
    """The wall time of the steps after ``kept``."""
    # From the moment the run was at the kept step (the kept checkpoint's commit, when this run made it; else the
    # first step of the run) to its last step; for a run that was killed, to its last event.
    since = next((t for t, step, _ in life.checkpoints if step == kept), None)
    if since is None:
        since = next((t for t, step in life.points if step >= kept), life.start)
    until = life.end if life.cut_short else life.points[-1][0]
    return max(0.0, until - since)


def _kept(life: RunLife, following: RunLife | None) -> int:
    """The last step of ``life`` that survived it: where the next run resumed, else its newest checkpoint."""
    if following is not None:
        return following.resumed_from if following.resumed_from is not None else -1
    return max(life.last_checkpoint if life.last_checkpoint is not None else -1,
               life.resumed_from if life.resumed_from is not None else -1)


# -- the text rendering ------------------------------------------------------------------------------------------


def totals(life: JobLife) -> str:
    last = "no step recorded" if life.last_step is None else f"reached step {life.last_step}"
    return (f"totals: {len(life.runs)} run(s), {last} in {duration(life.wall_s)}; work lost {life.lost_steps} "
            f"step(s) ({duration(life.lost_s)}); waiting between runs {duration(sum(life.gaps))}; saving "
            f"{duration(life.save_s)} ({life.checkpoints} checkpoint(s))")


class _Canvas:
    """A grid of characters, wall time across (``t0``..``t1``) and steps up (``s0``..``s1``)."""

    def __init__(self, t0: float, t1: float, s0: int, s1: int, width: int, height: int) -> None:
        self.t0, self.t1, self.s0, self.s1, self.width, self.height = t0, t1, s0, s1, width, height
        self.grid = [[" "] * width for _ in range(height)]

    def col(self, t: float) -> int:
        """The column of wall time ``t``, within the grid (a time outside the chart's is drawn at its edge)."""
        return max(0, min(self.width - 1, int((t - self.t0) / max(self.t1 - self.t0, 1e-9) * (self.width - 1) + 0.5)))

    def row(self, step: int) -> int:
        """The row of ``step``, within the grid (a step outside the chart's is drawn at its edge)."""
        return self.height - 1 - max(0, min(self.height - 1, int((step - self.s0) / max(self.s1 - self.s0, 1) *
                                                                 (self.height - 1) + 0.5)))

    def put(self, t: float, step: int, mark: str) -> None:
        self.grid[self.row(step)][self.col(t)] = mark

    def run(self, run: RunLife, following: RunLife | None, index: int) -> None:
        if run.points:  # start-up: from the run's start to its first step
            for c in range(self.col(run.start), self.col(run.points[0][0])):
                self.grid[self.row(run.points[0][1])][c] = "-"
        self._progress(run, str(index % 10))
        for t, step, _ in run.checkpoints:
            self.put(t, step, "*")
        if run.stop_time is not None and run.stop_step is not None:
            self.put(run.stop_time, run.stop_step, "x")
        if following is not None and run.points:
            level = self.row(following.resumed_from if following.resumed_from is not None else self.s0)
            for c in range(self.col(run.end) + 1, self.col(following.start)):
                if self.grid[level][c] == " ":
                    self.grid[level][c] = "."

    def _progress(self, run: RunLife, mark: str) -> None:
        """The run's steps, line by line between its points; ``!`` where the steps were lost."""
        for (ta, sa), (tb, sb) in zip(run.points, run.points[1:] + run.points[-1:], strict=True):
            a, b = self.col(ta), self.col(tb)
            for c in range(a, b + 1):
                step = round(sa + (0.0 if b == a else (c - a) / (b - a)) * (sb - sa))
                lost = run.lost_after is not None and step > run.lost_after
                self.grid[self.row(step)][c] = "!" if lost else mark

    def lines(self) -> list[str]:
        label = len(str(self.s1))
        out = []
        for i, cells in enumerate(self.grid):
            step_here = self.s1 if i == 0 else self.s0 if i == self.height - 1 else None
            out.append(f"{'' if step_here is None else step_here:>{label}} |{''.join(cells).rstrip()}")
        out.append(f"{'':>{label}} +{'-' * self.width}")
        start, end = "0 s", duration(self.t1 - self.t0)
        out.append(f"{'':>{label}}  {start}{end:>{self.width - len(start)}}")
        return out


def render(life: JobLife, *, width: int = 64, height: int = 12) -> list[str]:
    """The timeline as text: wall time across, steps up. A run is drawn with its place in the job's runs (the
    restart count's last digit when no in-job restart came between), then
    ``-`` its start-up, ``*`` a checkpoint, ``x`` the stop, ``!`` steps that were lost, ``.`` the wait before the
    next run."""
    points = [(t, s) for r in life.runs for t, s in r.points]
    if not points:
        return ["(no steps recorded: nothing to draw)"]
    canvas = _Canvas(life.runs[0].start, max(life.runs[-1].end, max(t for t, _ in points)),
                     min(0, min(s for _, s in points)), max(s for _, s in points), width, height)
    for index, (run, following) in enumerate(_with_next(life.runs)):
        canvas.run(run, following, index)
    return canvas.lines()


def duration(seconds: float) -> str:
    if seconds < 100:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


# -- the picture (matplotlib, optional) --------------------------------------------------------------------------


def draw(life: JobLife, path: Path, *, title: str | None = None, below: Callable[[Any], None] | None = None
         ) -> Path:
    """Write the timeline to ``path`` (its suffix picks the format: .png, .svg, .pdf); ``below`` draws into a strip
    of axes under it (the goodput's bar). Needs matplotlib (``pip install 'slurmrt[plot]'``)."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("drawing the timeline needs matplotlib: pip install 'slurmrt[plot]' (or matplotlib); "
                          "without it, `slurmrt status` prints the timeline as text") from err
    matplotlib.use("Agg")  # no display on a login node; and never a GUI window
    import matplotlib.pyplot as plt

    t0 = life.runs[0].start if life.runs else 0.0
    if below is None:
        fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    else:
        fig, (ax, strip) = plt.subplots(2, 1, figsize=(10, 6), dpi=100, gridspec_kw={"height_ratios": [5, 1]})
        below(strip)
    try:
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (run, following) in enumerate(_with_next(life.runs)):  # an in-job restart's step: a colour too
            _plot_run(ax, run, following, colors[i % len(colors)], t0)
        ax.set_xlim(left=0)
        ax.set_xlabel("wall time since the first run started (s)")
        ax.set_ylabel("step")
        ax.set_title(title or f"job {life.job}" + (f" - experiment {life.experiment}" if life.experiment else ""))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        legend = "o checkpoint   x stop   dotted: start-up   red: lost work   grey: waiting between runs"
        fig.text(0.01, 0.035, legend, fontsize=7)
        fig.text(0.01, 0.01, totals(life), fontsize=7)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def _plot_run(ax: Any, run: RunLife, following: RunLife | None, color: str, t0: float) -> None:
    """One run on the picture's axes: its steps, start-up, checkpoints, lost work, stop and the wait after it."""
    xs = [t - t0 for t, _ in run.points]
    ys = [s for _, s in run.points]
    ending = "replaced in the job" if run.left else run.outcome or "no clean exit"
    why = f" ({', '.join(run.reasons)})" if run.reasons else ""
    ax.plot(xs, ys, color=color, linewidth=2, label=f"run {run.label}: {ending}{why}" +
            (f", in-job restart without {', '.join(run.left)}" if run.left else ""))
    if run.points:  # start-up: from the run's start to its first step
        ax.plot([run.start - t0, xs[0]], [ys[0], ys[0]], color=color, linewidth=1, linestyle=":")
    if run.checkpoints:
        ax.scatter([t - t0 for t, _, _ in run.checkpoints], [s for _, s, _ in run.checkpoints],
                   marker="o", color=color, edgecolor="black", zorder=3, s=30)
    _plot_end(ax, run, following, t0)


def _plot_end(ax: Any, run: RunLife, following: RunLife | None, t0: float) -> None:
    """How the run ended: the work it lost, its stop, and the wait for the next run."""
    if run.lost_after is not None:
        lost = [(t - t0, s) for t, s in run.points if s >= run.lost_after]
        ax.plot([x for x, _ in lost], [s for _, s in lost], color="red", linewidth=5, alpha=0.35)
        ax.annotate(f"lost {run.lost_steps} steps", (lost[-1][0], lost[-1][1]), textcoords="offset points",
                    xytext=(4, 6), color="red", fontsize=8)
    if run.stop_time is not None and run.stop_step is not None:
        ax.scatter([run.stop_time - t0], [run.stop_step], marker="x", color="black", s=60, zorder=4)
    if following is not None:
        ax.axvspan(run.end - t0, following.start - t0, color="grey", alpha=0.2, linewidth=0)
