#!/usr/bin/env bash
# The whole suite as `make test` runs it: the cluster scenarios (`pytest -m slurm`, real sbatch jobs that spend most
# of their time waiting on Slurm: time limits of whole minutes, requeue holds, grace times) beside everything else
# (`pytest -m "not slurm"`, which keeps the CPUs busy). Run one after the other, they took most of CI's time limit on
# a 2-core machine; side by side, the wait of one is the work of the other.
#
# The two never meet: the test cluster numbers its jobs from FirstJobId=100 (tests/slurm/cluster.sh), above the ids
# 5 and 7 the integration tests fake, and simulated jobs keep to the upper half of the port blocks
# (slurmrt.sim.jobids), out of reach of the cluster's ports; every test has a bad-node ledger of its own
# (tests/conftest.py). The cluster is started here first, when it can be: two starts at once would race for the
# package manager and the daemons' ports.
#
# Extra arguments go to both pytest runs. The exit status is the first failure's (pytest's 5, no test collected, only
# when neither run collected one). `python -m pytest` alone still runs the whole suite in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
log=$(mktemp /tmp/slurmrt-tests-slurm-XXXXXX.log)
started=0
cluster=""
shown=0
show() {  # the cluster scenarios' output, once: also when interrupted (a CI time limit, Ctrl-C), so none is lost
    [ "$shown" = 1 ] && return
    shown=1
    echo
    echo "======================== the cluster scenarios (pytest -m slurm) ========================"
    cat "$log"
}
finish() {
    [ -n "$cluster" ] && kill -- "$cluster" 2>/dev/null && wait "$cluster" 2>/dev/null
    show
    [ "$started" = 1 ] && bash tests/slurm/cluster.sh stop >/dev/null 2>&1
    rm -f "$log"
}
trap finish EXIT
trap 'exit 130' INT TERM

if [ "$(id -u)" -eq 0 ] && ! bash tests/slurm/cluster.sh status >/dev/null 2>&1; then
    if bash tests/slurm/cluster.sh start; then
        started=1
    else
        echo "tests/run.sh: the test cluster did not start; the cluster scenarios will say why" >&2
    fi
fi

echo "tests/run.sh: the cluster scenarios (pytest -m slurm) run beside the rest; their output follows the rest's"
"$PY" -m pytest -m slurm "$@" >"$log" 2>&1 &
cluster=$!
"$PY" -m pytest -m "not slurm" "$@"
rest=$?
wait "$cluster"
slurm=$?
cluster=""
show
echo "tests/run.sh: pytest -m 'not slurm' exited $rest, pytest -m slurm exited $slurm"

if [ "$rest" -eq 5 ] && [ "$slurm" -eq 5 ]; then exit 5; fi
for rc in "$rest" "$slurm"; do
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
done
exit 0
