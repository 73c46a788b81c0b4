"""Run the benchmarks and write benchmarks/RESULTS.md.

    python -m benchmarks.run                 # all of them
    python -m benchmarks.run stop_check      # one (or several) by name
    python -m benchmarks.run --quick         # smaller sizes, for a smoke test
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ._common import HERE, machine

NAMES = ["stop_check", "stop_latency", "time_limit", "checkpoint", "logging", "startup", "hostlist", "inprocess",
         "integrations", "hang", "recovery", "straggler", "scale", "cluster_cost", "health"]
#: Run only when named: each takes tens of minutes (`python -m benchmarks.run goodput`); goodput_cluster needs the
#: test cluster (tests/slurm/cluster.sh start).
LONG = ["goodput", "goodput_cluster"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"any of {', '.join(NAMES + LONG)} (default: all but {', '.join(LONG)})")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(NAMES + LONG))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(NAMES + LONG)}")
    names = args.names or NAMES
    sections = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        section = importlib.import_module(f"benchmarks.bench_{name}").run(quick=args.quick)
        print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        sections.append(section)
    command = ("python -m benchmarks.run " + shlex.join(sys.argv[1:])).strip()
    stamp = f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, `{command}`" + \
        (" (quick sizes)" if args.quick else "")
    fresh = {s.title: f"## {s.title}\n\n_measured {stamp}_\n\n{s.body}\n" for s in sections}
    # A run of some benchmarks replaces their sections and keeps the others, each with the run that measured it.
    kept = {} if set(names) == set(NAMES) else _old_sections(args.out)
    merged = [fresh.pop(title, text) for title, text in kept.items()] + list(fresh.values())
    header = [
        "# slurmrt benchmarks",
        "",
        f"- machine: {machine()}",
        "- every section says when and by which command it was measured",
        "",
        "Every figure is measured against a comparator in the same run; absolute times on a shared 2-core machine "
        "move from run to run, the ratios much less.",
        "",
    ]
    args.out.write_text("\n".join(header) + "\n".join(merged) + _kept_notes(args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _old_sections(out: Path) -> dict[str, str]:
    """The measured sections of an earlier RESULTS.md, by title (the notes at the end are kept apart)."""
    old = out.read_text() if out.exists() else ""
    notes = old.find(NOTES_HEADING)
    old = old if notes < 0 else old[:notes]
    # A file written before sections carried their own stamp: its header's date and command stand for all of them.
    date = next((line[len("- date: "):] for line in old.splitlines() if line.startswith("- date: ")), None)
    command = next((line[len("- command: "):] for line in old.splitlines() if line.startswith("- command: ")), "")
    sections = {}
    for part in old.split("\n## ")[1:]:
        title, _, body = part.rstrip("\n").partition("\n")
        if date and not body.lstrip().startswith("_measured "):
            body = f"\n_measured {date}, {command}_\n{body}"
        sections[title] = f"## {title}\n{body}\n"
    return sections


#: The hand-written reading of the figures at the end of RESULTS.md; a new run keeps it, to be updated by hand.
NOTES_HEADING = "## What the figures mean"


def _kept_notes(out: Path) -> str:
    old = out.read_text() if out.exists() else ""
    at = old.find(NOTES_HEADING)
    return "" if at < 0 else "\n" + old[at:]

if __name__ == "__main__":
    sys.exit(main())
