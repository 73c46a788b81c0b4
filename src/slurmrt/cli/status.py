"""``slurmrt status``: restarts, stop reasons, checkpoints and lost time, from the event log.

Reads the event logs (events-*.jsonl) in checkpoint directories: one line per run of each job, with how it started,
why it stopped, its last checkpoint, how it exited and the time lost.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from ..events import Event, Run, read_events, runs, timestamp
from ._common import add_command, default_dirs, event_files


def run(args: argparse.Namespace) -> int:
    for line in status(args.dirs or default_dirs(os.environ)):
        print(line)
    return 0


def status(dirs: Iterable[Path]) -> list[str]:
    files = event_files(dirs)
    if not files:
        raise SlurmrtError(f"no event log (events-*.jsonl) in {', '.join(str(d) for d in dirs)}")
    out: list[str] = []
    for f in files:
        job_runs = runs(read_events(f))
        job = job_runs[0].events[0].get("job") if job_runs else f.stem
        restarts = max((r.restart for r in job_runs), default=0)
        out.append(f"job {job}: {len(job_runs)} run(s), {restarts} restart(s)  [{f}]")
        previous_end: float | None = None
        for run_ in job_runs:
            out.append(f"  run {run_.restart}: {'; '.join(_describe(run_, previous_end))}")
            previous_end = run_.end
    return out


def _describe(run_: Run, previous_end: float | None) -> list[str]:
    decision = run_.first(Event.DECISION)
    exit_event = run_.first(Event.EXIT)
    saves = run_.all(Event.SAVE)
    lost = []
    if previous_end is not None:
        lost.append(f"{run_.start - previous_end:.0f} s down between runs")
    if exit_event is None:
        since = timestamp(saves[-1]) if saves else run_.start
        lost.append(f"{run_.end - since:.0f} s of work after the last checkpoint (the run ended without a clean exit)")
    parts = [
        f"resumed after step {run_.resumed_from}" if run_.resumed_from is not None else "fresh start",
        f"stopped at step {decision['step']} ({', '.join(decision['reasons'])})" if decision else "no stop",
        f"last checkpoint step {run_.last_checkpoint}" if saves else "last checkpoint none",
        f"exit {exit_event.get('outcome', exit_event.get('code'))}" if exit_event else "no exit recorded",
    ]
    if lost:
        parts.append(f"lost: {', '.join(lost)}")
    return parts


def add_parser(sub: Any) -> None:
    p = add_command(sub, "status", run, doc=__doc__,
                    help="restarts, stop reasons, checkpoints and lost time, from the event log",
                    epilog="example: slurmrt status /shared/ckpt/run17")
    p.add_argument("dirs", type=Path, nargs="*", help="checkpoint dirs or event logs (default: "
                                                      "$SLURMRT_CHECKPOINT_DIR, else the current directory)")
