"""``slurmrt status``: the life of a job from its event log: runs, stop reasons, checkpoints, lost work, waits.

Reads the event logs (events-*.jsonl) in checkpoint directories. For each job: one line per run (how it started,
why it stopped, its last checkpoint, how it exited, what it lost), the timeline drawn as text (wall time across,
steps up), the totals, and the goodput: the share of the wall time that was productive, and where the rest
went. ``--plot FILE`` also draws it with matplotlib (.png, .svg or .pdf).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from .._text import shorten
from ..checkpoint.advice import advice, saving
from ..options import Options
from ..record.chart import draw, duration, render, totals
from ..record.code import changes
from ..record.events import Event, read_events
from ..record.goodput import Goodput, account, draw_bar
from ..record.timeline import JobLife, RunLife, build, counted
from ..record.train import trains
from ._common import add_command, default_dirs, event_files
from ._json import add_flag, emit


def run(args: argparse.Namespace) -> int:
    dirs = args.dirs or default_dirs(os.environ)
    if args.json:
        jobs = status_data(dirs)
        emit("status", {"jobs": jobs})
        return 0 if jobs and all(job["runs"] for job in jobs) else 1
    lines = status(dirs, chart=not args.no_chart, plot=args.plot)
    for line in lines:
        print(line)
    return 1 if any(line.startswith(_NOTHING) for line in lines) else 0


_NOTHING = "no slurmrt event in"


def _node_h() -> float:
    """The prior failure rate the jobs' saves are judged with: SLURMRT_MTBF_NODE_H as the jobs had it, checked."""
    name = "SLURMRT_MTBF_NODE_H"
    return Options.resolve({}, {name: os.environ[name]} if name in os.environ else {}).mtbf_node_h


def status_data(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """``--json``: per event log, the job, its runs (as ``slurmrt.record.timeline.RunLife`` holds them, without the
    step samples) and its totals. Times are epoch seconds, durations seconds."""
    files = _files(list(dirs))
    jobs = []
    for f in files:
        events = list(read_events(f))
        life = build(events, job=f.stem.removeprefix("events-"))
        certified = _certified(events)
        runs = []
        for i, run_ in enumerate(life.runs):
            fields = {k: v for k, v in asdict(run_).items() if k != "points"}
            fields["checkpoints"] = [{"time": t, "step": s, "seconds": d, "certified": s in certified}
                                     for t, s, d in run_.checkpoints]
            runs.append({"label": run_.label, **fields, "gap_before_s": life.gaps[i - 1] if i else None})
        jobs.append({"job": life.job, "experiment": life.experiment, "event_log": str(f), "runs": runs,
                     "job_runs": life.job_runs, "restarts": max((r.restart for r in life.runs), default=0),
                     "in_job_restarts": life.in_job_restarts, "in_process_restarts": life.in_process_restarts,
                     "totals": {"wall_s": life.wall_s, "last_step": life.last_step, "lost_steps": life.lost_steps,
                                "lost_s": life.lost_s, "save_s": life.save_s, "checkpoints": life.checkpoints,
                                "waiting_s": sum(life.gaps)},
                     "certified": sorted(certified),
                     "goodput": account(events, life).as_dict(),
                     "saving": saving(events, node_h=_node_h())})
    return jobs


def _files(dirs: list[Path]) -> list[Path]:
    for d in dirs:
        if not d.exists():
            raise SlurmrtError(f"{d} does not exist: give the checkpoint directory (or the event log's)")
        if d.is_dir() and not os.access(d, os.R_OK | os.X_OK):
            raise SlurmrtError(f"{d}: permission denied (its event logs cannot be listed)")
    files = event_files(dirs)
    if not files:
        raise SlurmrtError(f"no event log (events-*.jsonl) in {', '.join(str(d) for d in dirs)}")
    return files


def status(dirs: Iterable[Path], *, chart: bool = True, plot: Path | None = None) -> list[str]:
    files = _files(list(dirs))
    out: list[str] = []
    lives = []
    for f in files:
        events = list(read_events(f))
        life = build(events, job=f.stem.removeprefix("events-"))
        lives.append(life)
        if not life.runs:
            out.append(f"{_NOTHING} {f}: it is empty, or damaged (each line it skipped is in the warnings above)")
            continue
        ledger = account(events, life)
        out += _job(life, f, chart=chart)
        certified = sorted(_certified(events))
        if certified:
            out.append(f"  certified checkpoint(s): step {', '.join(map(str, certified))} (the training stayed healthy "
                       "after each; retention never deletes the newest)")
        out += [f"  {line}" for line in ledger.lines()]
        out += [f"  {line}" for line in advice(events, node_h=_node_h())]
        if plot is not None:
            target = plot if len(files) == 1 else plot.with_name(f"{plot.stem}-{life.job}{plot.suffix}")
            out.append(f"  drawn: {_draw(life, target, ledger)}")
    return out + trains(lives)  # the jobs of one experiment (an array train), read together


def _certified(events: list[dict[str, Any]]) -> set[int]:
    """The checkpoints the training's health check certified (``certified`` events)."""
    return {e["step"] for e in events if e.get("event") == Event.CERTIFIED.value and isinstance(e.get("step"), int)}


def _job(life: JobLife, f: Path, *, chart: bool) -> list[str]:
    """One job's lines: its runs, the timeline, the totals."""
    out = [_header(life, f)]
    for i, run_ in enumerate(life.runs):
        out.append(f"  run {run_.label}: {'; '.join(_describe(run_, life.gaps[i - 1] if i else None))}")
        changed = changes(life.runs[i - 1].code, run_.code) if i else []
        if changed:  # a requeued run on an edited script: said where it begins
            out[-1] += f"; code changed since run {life.runs[i - 1].label}: {', '.join(changed)}"
    if chart:
        out.append("  timeline (wall time across, steps up; 0-9: the run, -: start-up, *: checkpoint, x: stop, "
                   "!: lost work, .: waiting):")
        out.extend(f"    {line}" for line in render(life))
    out.append(f"  {totals(life)}")
    return out


def _header(life: JobLife, f: Path) -> str:
    """The job's first line: its runs, and how many of each restart."""
    restarts = max((r.restart for r in life.runs), default=0)
    in_process = life.in_process_restarts
    experiment = f", experiment {life.experiment}" if life.experiment else ""
    process = f", {in_process} in-process restart(s)" if in_process else ""
    return (f"job {life.job}{experiment}: {counted(life.job_runs, life.in_job_restarts)}: {restarts} requeue(s), "
            f"{life.in_job_restarts} in-job restart(s){process}  [{f}]")


def _draw(life: JobLife, path: Path, ledger: Goodput) -> Path:
    try:
        return draw(life, path, below=lambda ax: draw_bar(ax, ledger))
    except ImportError as err:
        raise SlurmrtError(str(err)) from None


def _resumed(run_: RunLife) -> str:
    if not run_.loaded:
        return "ended in its start-up, before its load"
    if run_.resumed_from is None:
        return "fresh start"
    tier = ""
    if run_.resumed_tier == "local":
        tier = f" from the local tier ({run_.from_peers or 0} bytes from other nodes)"
    elif run_.resumed_tier == "shared":
        tier = " from the shared tier"
    return f"resumed after step {run_.resumed_from}{tier}"


def _lost(run_: RunLife, gap: float | None) -> list[str]:
    lost = []
    if gap is not None:
        lost.append(f"{duration(gap)} down between runs")
    if run_.lost_steps or run_.lost_s:
        bound = "at least " if run_.cut_short else ""
        lost.append(f"{duration(run_.lost_s)} of work after the checkpoint kept ({bound}{run_.lost_steps} step(s))")
    redone = run_.in_process_cost
    if redone.redone_steps or redone.redone_s:
        lost.append(f"{duration(redone.redone_s)} of work trained again after in-process restart(s) "
                    f"({redone.redone_steps} step(s))")
    return lost


def _exit(run_: RunLife) -> str:
    """How the run's processes ended. A step replaced in the job exits HUNG on purpose (slurmrt run reads the
    request, not the code): that is said as what it was."""
    if run_.left or (run_.recovery or {}).get("action") == "in_job_restart":
        return "replaced by a new step in the job"
    return f"exit {run_.outcome}" if run_.outcome else "no exit recorded (killed?)"


def _describe(run_: RunLife, gap: float | None) -> list[str]:
    # Shape: one optional part of the run's line per fact, in the order the line reads
    parts = [
        _resumed(run_),
        f"stopped at step {run_.stop_step} ({', '.join(run_.reasons)})" if run_.stop_step is not None else "no stop",
        f"last checkpoint step {run_.last_checkpoint}" if run_.checkpoints else "last checkpoint none",
        _exit(run_),
    ]
    if run_.last_step is not None:  # from the exit event when the run recorded it: where training really got to
        parts.append(f"{'reached' if run_.outcome else 'last seen at'} step {run_.last_step}")
    if run_.stragglers:
        parts.append(f"straggler {'; '.join(run_.stragglers)}")
    if run_.in_process:
        parts.append(f"in-process restart(s): {'; '.join(run_.in_process)}")
    if run_.recovery is not None:
        parts.append(_decided(run_.recovery))
    elif run_.left:
        why = shorten(run_.left_why, 100)
        parts.append(f"in-job restart without {', '.join(run_.left)}" + (f" ({why})" if why else ""))
    lost = _lost(run_, gap)
    if lost:
        parts.append(f"lost: {', '.join(lost)}")
    return parts


def _decided(decision: dict[str, Any]) -> str:
    """`slurmrt run`'s decision about the step's fault, in one part of the run's line."""
    # Shape: one line from a record another process wrote: each field checked where it is said
    left, kept = decision.get("left_out") or [], decision.get("kept") or []
    action = str(decision.get("action") or "?").replace("_", " ")
    where = f" without {', '.join(map(str, left))}" if left else \
        f" on the same nodes ({', '.join(map(str, kept))})" if kept and action == "in job restart" else ""
    why = str(decision.get("why") or "")
    why = shorten(why, 100)
    return (f"decision: {str(decision.get('class') or '?').replace('_', ' ')} ({decision.get('trigger')}), "
            f"{action}{where}" + (f": {why}" if why else ""))


def add_parser(sub: Any) -> None:
    p = add_command(sub, "status", run, doc=__doc__,
                    help="the life of a job: runs, stop reasons, checkpoints, lost work, from the event log",
                    epilog="examples:\n  slurmrt status /shared/ckpt/run17\n"
                           "  slurmrt status /shared/ckpt/run17 --plot run17.png   (needs matplotlib)")
    p.add_argument("dirs", type=Path, nargs="*", help="checkpoint dirs or event logs (default: "
                                                      "$SLURMRT_CHECKPOINT_DIR, else the current directory)")
    p.add_argument("--plot", type=Path, metavar="FILE",
                   help="also draw the timeline into FILE (.png, .svg, .pdf); needs matplotlib")
    p.add_argument("--no-chart", action="store_true", help="leave out the text timeline")
    add_flag(p)
