#!/usr/bin/env bash
# Is the suite independent of the machine's speed? Runs pytest IDLE times on an idle machine, then LOADED times
# while two `python -c 'while True: pass'` processes spin on the CPUs, and prints how often each test passed.
#
#   tests/stress/repeat.sh 5 3                   # the whole suite (make test-repeat)
#   tests/stress/repeat.sh 5 3 -m "not slurm"    # extra arguments go to pytest
#
# Exit 0 only when every test passed in every run.
set -uo pipefail
cd "$(dirname "$0")/../.."
idle=${1:-5}; loaded=${2:-3}; shift 2 || true
py=$PWD/.venv/bin/python
out=$(mktemp -d /tmp/slurmrt-repeat-XXXXXX)
spinners=()
stop_spinners() { for pid in "${spinners[@]}"; do kill "$pid" 2>/dev/null; done; spinners=(); }
trap stop_spinners EXIT
for k in $(seq $((idle + loaded))); do
    if [ "$k" -gt "$idle" ] && [ ${#spinners[@]} -eq 0 ]; then
        for _ in 1 2; do python3 -c 'while True: pass' & spinners+=($!); done
    fi
    kind=$([ "$k" -gt "$idle" ] && echo loaded || echo idle)
    start=$(date +%s)
    "$py" -m pytest -q -p no:cacheprovider --junitxml="$out/$kind-$k.xml" "$@" >"$out/$kind-$k.log" 2>&1
    echo "run $k ($kind): exit $? in $(( $(date +%s) - start )) s: $(tail -n 1 "$out/$kind-$k.log")"
done
stop_spinners
"$py" - "$out" <<'PY'
import sys, collections, pathlib, xml.etree.ElementTree as ET
runs = sorted(pathlib.Path(sys.argv[1]).glob("*.xml"))
counts = collections.defaultdict(collections.Counter)
for run in runs:
    for case in ET.parse(run).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        counts[name][outcome] += 1
bad = {n: c for n, c in counts.items() if c["passed"] != len(runs)}
print(f"{len(counts)} tests, {len(runs)} runs: {len(counts) - len(bad)} passed in every run")
for name, c in sorted(bad.items()):
    print(f"  {name}: passed {c['passed']}, failed {c['failed']}, skipped {c['skipped']} of {len(runs)}")
print(f"logs and junit files: {sys.argv[1]}")
sys.exit(1 if bad else 0)
PY
