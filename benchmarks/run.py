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

NAMES = ["stop_check", "stop_latency", "time_limit", "checkpoint", "logging", "startup", "hostlist"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)} (default: all)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(NAMES))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    names = args.names or NAMES
    sections = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        section = importlib.import_module(f"benchmarks.bench_{name}").run(quick=args.quick)
        print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        sections.append(section)
    command = "python -m benchmarks.run " + shlex.join(sys.argv[1:])
    header = [
        "# slurmrt benchmarks",
        "",
        f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        f"- command: `{command.strip()}`" + (" (quick sizes)" if args.quick else ""),
        "",
        "Every figure is measured against a comparator in the same run; absolute times on a shared 2-core machine "
        "move from run to run, the ratios much less.",
        "",
    ]
    body = [f"## {s.title}\n\n{s.body}\n" for s in sections]
    args.out.write_text("\n".join(header) + "\n".join(body) + _kept_notes(args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


#: The hand-written reading of the figures at the end of RESULTS.md; a new run keeps it, to be updated by hand.
NOTES_HEADING = "## What the figures mean"


def _kept_notes(out: Path) -> str:
    old = out.read_text() if out.exists() else ""
    at = old.find(NOTES_HEADING)
    return "" if at < 0 else "\n" + old[at:]

if __name__ == "__main__":
    sys.exit(main())
