"""The timeline drawn: the totals line, the text chart (wall time across, steps up) and the matplotlib picture of a
:class:`~slurmrt.record.timeline.JobLife`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .timeline import JobLife, RunLife, counted

__all__ = ["draw", "duration", "render", "totals"]


# -- the text rendering ------------------------------------------------------------------------------------------


def totals(life: JobLife) -> str:
    last = "no step recorded" if life.last_step is None else f"reached step {life.last_step}"
    return (f"totals: {counted(life.job_runs, life.in_job_restarts)}, {last} in {duration(life.wall_s)}; work lost "
            f"{life.lost_steps} step(s) ({duration(life.lost_s)}); waiting between runs {duration(sum(life.gaps))}; "
            f"saving {duration(life.save_s)} ({life.checkpoints} checkpoint(s))")


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
        # Shape: one optional mark per fact of the run (start-up, progress, checkpoints, stop, wait), in drawing order
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


def _with_next(lives: list[RunLife]) -> list[tuple[RunLife, RunLife | None]]:
    """Each run with the one after it (None for the last)."""
    return list(zip(lives, [*lives[1:], None], strict=True)) if lives else []


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
    # Shape: one optional mark per fact of the run (start-up, checkpoints), in drawing order
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
