"""``slurmrt kill``: create a kill switch, and say which jobs watch it.

Creates PATH. Every job started with that kill switch saves, stops and exits 0 without requeue; tasks of an array
not yet started exit at init.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import SlurmrtError
from ..record.events import Event, read_events
from ._common import add_command, add_events, default_dirs, event_files


def run(args: argparse.Namespace) -> int:
    watchers = kill(args.path, events_dirs=args.events or default_dirs(os.environ))
    print(f"created kill switch {args.path}")
    if watchers:
        print("watched by (from the event logs):")
        for w in watchers:
            print(f"  {w}")
    else:
        searched = ", ".join(str(d) for d in args.events) if args.events else None
        print(f"no event log in {searched} mentions it" if searched else
              "no event log found that mentions it (pass --events DIR to search a checkpoint directory)")
    return 0


def kill(path: Path, *, events_dirs: Iterable[Path]) -> list[str]:
    """Create the kill switch; return the jobs whose event logs say they watch it."""
    if not path.parent.is_dir():
        raise SlurmrtError(f"cannot create kill switch {path}: directory {path.parent} does not exist")
    path.touch()
    target = str(path.resolve())
    watchers = []
    for f in event_files(events_dirs):
        for e in read_events(f):
            if e.get("event") == Event.INIT.value and e.get("kill_switch") == target:
                watchers.append(f"job {e.get('job')} (restart {e.get('restart')}, started {e.get('time')})")
    return watchers


def add_parser(sub: Any) -> None:
    p = add_command(sub, "kill", run, doc=__doc__, help="create a kill switch, and say which jobs watch it",
                    epilog="example: slurmrt kill /shared/stop-run17 --events /shared/ckpt/run17")
    p.add_argument("path", type=Path, help="the kill switch: the path the jobs watch (init(kill_switch=...))")
    add_events(p, "to search for jobs that watch the switch")
