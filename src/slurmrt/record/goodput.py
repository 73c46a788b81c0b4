"""Goodput: where a job's wall time went, from its event log (issue 41).

Every second from the first run's start to the last run's end falls in one category:

- ``productive``: training whose steps were kept;
- ``process_start``: from Slurm's start of a run (rank 0's first ``progress`` event says it: ``squeue``'s %S, or
  ``SLURM_JOB_START_TIME``) or, where unknown, its process's start, to ``init()``: the batch script, the launcher,
  the interpreter, the imports, the script's own set-up (the ``init`` event measures its process's part);
- ``startup``: from ``init()`` (the launch checks, the rendezvous) to the end of its checkpoint load, the load apart (a
  run that never loads: to its first step; a run that ended before either: up to its fault);
- ``load``: reading the checkpoint it resumed from;
- ``checkpoint_stall``: saves that blocked training (blocking saves; a background save's write does not block);
- ``lost_work``: steps trained after the last checkpoint that survived the run, redone by the next one (a blocking
  save among them is stall, not lost work as well);
- ``health_rerun``, ``health_rewind``: an unhealthy step (``rt.check``) answered in the process, by its rung: from the
  fault to the next load, and the steps trained again from the checkpoint loaded to the fault (a rewind's are the
  skipped steps' first training, lost with them);
- ``recovery``: a run cut short (a hang, a lost node or rank, a failed health check): from its last step to its end,
  the hang allowance, the census and the exit;
- ``stopping``: a run that stopped or finished: from its last step to its end, saves apart (draining, teardown);
- ``waiting``: between two runs: the requeue, the queue, the next allocation's start.

``productive`` is what is left of each run once the others are taken out, so the categories add up to the wall time.
Records that overlap (a save said to last longer than its run) are cut to the run, so no second counts twice.
The effective training time ratio (ETTR) is productive over wall time. Node-hour goodput weighs each run by its
nodes: productive node-seconds (the training nodes) over allocated node-seconds (every node of the allocation, spare
nodes included, while a run holds them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _figures as figures
from .._safefs import replace_text
from .chart import duration
from .events import Event, read_events, timestamp
from .runs import Run, runs
from .timeline import JobLife, RunLife, build

__all__ = ["CATEGORIES", "Goodput", "RunGoodput", "account", "draw_bar", "openmetrics", "write_metrics"]

logger = logging.getLogger(__name__)

#: The categories, in the order they are shown; their names are the JSON keys.
CATEGORIES = ("productive", "process_start", "startup", "load", "checkpoint_stall", "lost_work", "health_rerun",
              "health_rewind", "recovery", "stopping", "waiting")

#: How each category is said in text.
WORDS = {"productive": "productive", "process_start": "process start", "startup": "start-up", "load": "load",
         "checkpoint_stall": "checkpoint stall",
         "lost_work": "lost work", "health_rerun": "re-run of an unhealthy step",
         "health_rewind": "rewind past a reproducible fault", "recovery": "fault detection and recovery",
         "stopping": "stopping and draining",
         "waiting": "waiting between runs"}


@dataclass
class RunGoodput:
    label: str
    seconds: dict[str, float]
    #: Nodes that trained, and nodes the allocation held (spares included); None when the log does not say.
    nodes: int | None = None
    job_nodes: int | None = None


@dataclass
class Goodput:
    runs: list[RunGoodput] = field(default_factory=list)
    waiting_s: float = 0.0

    @property
    def seconds(self) -> dict[str, float]:
        total = {c: sum(r.seconds.get(c, 0.0) for r in self.runs) for c in CATEGORIES}
        total["waiting"] = self.waiting_s
        return total

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive seconds over wall seconds; None for an empty log."""
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def node_goodput(self) -> float | None:
        """Productive node-seconds over allocated node-seconds; None when a run's node count is unknown."""
        if not self.runs or any(r.nodes is None for r in self.runs):
            return None
        held = sum(sum(r.seconds.values()) * (r.job_nodes or r.nodes or 0) for r in self.runs)
        kept = sum(r.seconds["productive"] * (r.nodes or 0) for r in self.runs)
        return kept / held if held > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "seconds": self.seconds, "ettr": self.ettr, "node_goodput": self.node_goodput,
                "runs": [{"label": r.label, "nodes": r.nodes, "job_nodes": r.job_nodes, "seconds": r.seconds}
                         for r in self.runs]}

    def lines(self) -> list[str]:
        """The ledger in text: the ratios, then every category with its share."""
        wall = self.wall_s
        if wall <= 0:
            return ["goodput: no time recorded"]
        head = f"goodput: {self.ettr:.1%} of {duration(wall)} was productive (effective training time ratio)"
        if self.node_goodput is not None:
            head += f"; {self.node_goodput:.1%} of the node-hours"
        parts = [f"{WORDS[c]} {duration(s)} ({s / wall:.1%})" for c, s in self.seconds.items()
                 if s > 0 or c == "productive"]
        return [head, "  " + "; ".join(parts)]


def account(events: Iterable[dict[str, Any]], life: JobLife | None = None) -> Goodput:
    """The ledger of the job whose (rank 0's) events these are; ``life``: their timeline, when the caller built it
    already (``slurmrt status``), else it is built here."""
    events = list(events)
    life = build(events) if life is None else life
    grouped = runs(events)
    ledger = Goodput(waiting_s=sum(life.gaps))
    for run, one in zip(grouped, life.runs, strict=True):
        ledger.runs.append(_run(run, one))
    _fill_nodes(ledger.runs)
    return ledger


def _fill_nodes(runs: list[RunGoodput]) -> None:
    """A run that left no init event (killed in its start-up) held the nodes of the run before it (of the first
    run that says, for the first)."""
    known = [r for r in runs if r.nodes is not None]
    last = known[0] if known else None
    for r in runs:
        if r.nodes is None and last is not None:
            r.nodes, r.job_nodes = last.nodes, last.job_nodes
        elif r.nodes is not None:
            last = r


def _run(run: Run, life: RunLife) -> RunGoodput:
    wall = max(0.0, life.end - life.start)
    ready, load = _started(run, life)
    blocking = life.stalls
    cut = life.fault_at is not None
    last = max(ready, life.fault_at) if life.fault_at is not None else _last_step_at(life, ready)
    if not life.loaded and not life.points:  # it ended in its start-up: nothing trained, all of it up to the fault
        ready = last
    tail = _tail(life, last, blocking)
    cost = life.in_process_cost
    seconds = {"process_start": life.process_s, "startup": max(0.0, ready - life.start - life.process_s - load),
               "load": load, "checkpoint_stall": sum(s for _, s in blocking),
               "lost_work": life.lost_s + cost.redone_s, "health_rerun": cost.rerun_s, "health_rewind": cost.rewind_s,
               "recovery": (tail if cut else 0.0) + cost.back_s, "stopping": 0.0 if cut else tail}
    _within(seconds, wall)
    seconds["productive"] = max(0.0, wall - sum(seconds.values()))
    return _with_nodes(run, life.label, seconds)


#: The order in which badput that would exceed its run is cut: first what a record states (a save's or a load's
#: seconds, which other records cannot check), last what the timeline derives (the lost work the totals also say).
_CUT_FIRST = ("checkpoint_stall", "load", "recovery", "stopping", "startup", "process_start", "health_rerun",
              "health_rewind", "lost_work")


def _within(seconds: dict[str, float], wall: float) -> None:
    """A run's badput never exceeds its wall time: records that overlap (saves said to last longer than the run,
    two blocking saves at once) would count a second twice, and leave productive time below zero."""
    over = sum(seconds.values()) - wall
    for category in _CUT_FIRST:
        cut = min(seconds[category], max(0.0, over))
        seconds[category] -= cut
        over -= cut


def _with_nodes(run: Run, label: str, seconds: dict[str, float]) -> RunGoodput:
    init = run.first(Event.INIT) or {}
    return RunGoodput(label, {c: seconds.get(c, 0.0) for c in CATEGORIES if c != "waiting"},
                      nodes=_count(init.get("nnodes")), job_nodes=_count(init.get("job_nodes")))


def _tail(life: RunLife, last: float, blocking: list[tuple[float, float]]) -> float:
    """From ``last`` to the run's end, the blocking saves committed in it apart."""
    return max(0.0, max(0.0, life.end - last) - sum(s for t, s in blocking if t >= last))


def _last_step_at(life: RunLife, ready: float) -> float:
    return max(life.points[-1][0] if life.points else ready, ready)


def _started(run: Run, life: RunLife) -> tuple[float, float]:
    """When the run was ready to train (its resume or fresh start, within the run; a run that never loads: its
    first step), and how long its load took."""
    started = run.first_load
    begun = life.start + life.process_s  # init()
    if started is None:
        return (min(max(life.points[0][0], begun), life.end) if life.points else begun), 0.0
    ready = min(max(timestamp(started), begun), life.end)
    return ready, min(_number(started, "seconds"), ready - begun)


def _number(event: dict[str, Any] | None, key: str) -> float:
    value = (event or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0


def _count(value: Any) -> int | None:
    return figures.count(value, 1)


def openmetrics(ledger: Goodput, *, job: str, experiment: str | None) -> str:
    """The ledger as OpenMetrics text (Prometheus' textfile collector reads it): the ratios, and the seconds of each
    category, labelled with the job and the experiment."""
    labels = f'job="{_label(job)}"' + (f',experiment="{_label(experiment)}"' if experiment else "")
    lines = ["# HELP slurmrt_goodput_ratio Productive share of the job's wall time (effective training time ratio).",
             "# TYPE slurmrt_goodput_ratio gauge"]
    if ledger.ettr is not None:
        lines.append(f"slurmrt_goodput_ratio{{{labels}}} {ledger.ettr:.6f}")
    lines += ["# HELP slurmrt_node_goodput_ratio Productive node-seconds over the node-seconds the allocation held.",
              "# TYPE slurmrt_node_goodput_ratio gauge"]
    if ledger.node_goodput is not None:
        lines.append(f"slurmrt_node_goodput_ratio{{{labels}}} {ledger.node_goodput:.6f}")
    lines += ["# HELP slurmrt_time_seconds Seconds of the job's wall time, by category.",
              "# TYPE slurmrt_time_seconds gauge", "# UNIT slurmrt_time_seconds seconds"]
    lines += [f'slurmrt_time_seconds{{{labels},category="{c}"}} {s:.3f}' for c, s in ledger.seconds.items()]
    return "\n".join([*lines, "# EOF", ""])


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_metrics(path: Path, events: Path | None, *, job: str, experiment: str | None) -> None:
    """Rank 0, at the end of a run: the job's ledger so far into ``path``, replaced whole (a collector never reads
    half a file). Nothing without an event log; a failure is a warning, never the run's end."""
    if events is None:
        logger.warning("metrics_file=%s: no event log to account from (set checkpoint_dir or event_log)", path)
        return
    try:
        replace_text(path, openmetrics(account(read_events(events, own=True)), job=job, experiment=experiment))
    except OSError as err:
        logger.warning("the goodput metrics could not be written to %s: %s", path, err)


#: The bar's colours: productive green, each badput its own.
_COLORS = {"productive": "#2ca02c", "process_start": "#17becf",
           "startup": "#7f7f7f", "load": "#bcbd22", "checkpoint_stall": "#1f77b4",
           "lost_work": "#d62728", "recovery": "#9467bd", "stopping": "#8c564b", "waiting": "#c7c7c7"}


def draw_bar(ax: Any, ledger: Goodput) -> None:
    """The ledger as one stacked horizontal bar (shares of the wall time) on matplotlib axes."""
    wall, left = ledger.wall_s, 0.0
    for category, seconds in ledger.seconds.items():
        if wall <= 0 or seconds <= 0:
            continue
        share = seconds / wall
        ax.barh(0, share, left=left, color=_COLORS[category], label=f"{WORDS[category]} {share:.0%}")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("share of the wall time" + (f" (goodput {ledger.ettr:.0%})" if ledger.ettr is not None else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9), ncol=4, fontsize=7, frameon=False)
