#!/usr/bin/env bash
# How often does a finished run exit with anything but 0? Runs the quickstart N times, 2 processes each, and counts
# the runs where a process did not exit 0 or printed "terminate called" (gloo's teardown abort, issue 9).
#
#   tests/stress/exit_codes.sh torchrun 100    # torchrun on this machine, no Slurm
#   tests/stress/exit_codes.sh srun 100        # srun -N2 on the test cluster (tests/slurm/cluster.sh start)
#
# Not part of `make test`: 100 runs take about 15 minutes. The measured figures are in the closing notes.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?torchrun or srun}; n=${2:-100}
py=$PWD/.venv/bin/python
script=$PWD/examples/quickstart/train.py
log=$(mktemp -d /tmp/slurmrt-exit-codes-XXXXXX)
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=1
bad=0
for i in $(seq "$n"); do
    case $mode in
        torchrun) (cd "$log" && env -u SLURM_JOB_ID "$py" -m torch.distributed.run --nproc-per-node 2 "$script" --steps 5) \
                      >"$log/$i.log" 2>&1 ;;
        srun) SLURM_CONF=${SLURM_CONF:-/tmp/slurmrt-cluster/slurm.conf} srun -N2 --ntasks-per-node=1 \
                  --kill-on-bad-exit=1 "$py" "$script" --steps 5 >"$log/$i.log" 2>&1 ;;
        *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    rc=$?
    if [ "$rc" -ne 0 ] || grep -q "terminate called" "$log/$i.log"; then
        bad=$((bad + 1)); echo "run $i: exit $rc (log $log/$i.log)"
    else
        rm -f "$log/$i.log"
    fi
done
echo "$mode: $bad of $n runs did not end cleanly"
[ "$bad" -eq 0 ]
