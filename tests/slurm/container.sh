#!/bin/bash
# A container boundary with the properties that matter to slurmrt, as Pyxis/enroot or Apptainer give it: none of
# Slurm's commands inside (each is masked by an empty, non-executable file), a private /tmp, the rest of the machine
# read-only, and the directories named before `--` bound in, writable (the job's directory on the shared filesystem,
# the project's). Usage: container.sh DIR... -- COMMAND...
set -euo pipefail
args=(--ro-bind / / --dev-bind /dev /dev --tmpfs /tmp --die-with-parent)
for command in srun sbatch scontrol squeue scancel sinfo sacct sstat; do
    if path=$(command -v "$command"); then
        args+=(--ro-bind /dev/null "$path")
    fi
done
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    args+=(--bind "$1" "$1")
    shift
done
shift
exec bwrap "${args[@]}" "$@"
