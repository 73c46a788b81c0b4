"""``scontrol``, ``squeue``, ``scancel``, ``sbatch``, ``sinfo`` and ``srun`` for ``slurmrt sim``: small scripts on
the job's PATH, in front of any Slurm of the machine's own, which the simulator never asks.

They understand what a training job asks of Slurm: requeue itself, its end time, cancel itself, expand a hostlist,
start a step, arm a guard job on itself (``sbatch --dependency=afternotok:JOB --wrap ...``: the simulator runs it
when the job ends not COMPLETED, :mod:`.guards`), the size of its partition. Anything else fails loudly rather than
pretending. ``tests/unit/test_sim_shims.py`` fails when slurmrt calls a Slurm command that has no shim here.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..launch import hostlist
from . import guards
from .spec import JobSpec
from .state import SimState

SHIMS = ("srun", "scontrol", "squeue", "scancel", "sbatch", "sinfo")

#: The simulated partition's size: it makes up a node for each one excluded, up to this many.
PARTITION_NODES = 64


def install(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = shlex.quote(sys.executable)
    for name in SHIMS:
        module = "slurmrt.sim.srun" if name == "srun" else "slurmrt.sim.shims"
        args = "" if name == "srun" else f" {name}"
        path = bin_dir / name
        # -c, not -m: `python -m slurmrt.sim.shims` imports the package first, which imports this module, and
        # runpy then warned on every call ("found in sys.modules ... prior to execution").
        code = shlex.quote(f"import sys; from {module} import main; sys.exit(main())")
        path.write_text(f"#!/bin/sh\nexec {python} -c {code}{args} \"$@\"\n")
        path.chmod(0o755)
    return bin_dir


def _end_time(state: SimState) -> float | None:
    spec, job = state.read_job()
    return job["started"] + spec.time_s if spec.time_s else None


def scontrol(args: Sequence[str]) -> int:
    state = SimState.from_env()
    spec, job = state.read_job()
    if args[:1] == ["requeue"] and len(args) == 2:
        return _requeue(state, spec, args[1])
    if args[:1] == ["show"] and len(args) > 1:
        return _show(state, spec, job, list(args[1:]))
    if args[:1] == ["update"] and any(a.startswith("ExcNodeList=") for a in args):
        return _exclude(state, spec, next(a for a in args if a.startswith("ExcNodeList="))[len("ExcNodeList="):])
    return _unsupported(args)


def _show(state: SimState, spec: JobSpec, job: dict[str, Any], what: list[str]) -> int:
    """``scontrol show hostnames|job|node ...``."""
    if what[0] == "hostnames":
        for host in hostlist.expand(what[1] if len(what) > 1 else os.environ.get("SLURM_JOB_NODELIST", "")):
            print(host)
        return 0
    if what[0] == "job":
        return _show_job(state, spec, job)
    if what[0] == "node" and what[-1] in spec.node_names:
        return _show_node(state, what[-1])
    return _unsupported(["show", *what])


def _unsupported(args: Sequence[str]) -> int:
    print(f"scontrol (slurmrt sim): unsupported: {shlex.join(args)}", file=sys.stderr)
    return 1


def _show_node(state: SimState, node: str) -> int:
    print(f"NodeName={node} State={'DOWN*' if node in state.down() else 'ALLOCATED'}")  # a failed node stays down
    return 0


def _requeue(state: SimState, spec: JobSpec, job_id: str) -> int:
    if not spec.requeue:
        print(f"scontrol: error: Requested operation is presently disabled for job {job_id}", file=sys.stderr)
        return 1
    state.request("requeue")
    return 0


def _show_job(state: SimState, spec: JobSpec, job: dict[str, Any]) -> int:
    end = _end_time(state)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)) if end else "Unknown"
    excluded = hostlist.compress(sorted(state.excluded())) or "(null)"
    held = [n for n in spec.node_names if n not in state.down()]  # a failed node leaves a --no-kill job
    running = "PENDING" if state.requested("requeue") else guards.ended(state) or "RUNNING"
    print(f"JobId={spec.job_id} JobName={spec.job_name} JobState={running} Requeue={int(spec.requeue)} "
          f"Restarts={job['restart']} EndTime={stamp} Partition=sim NumNodes={len(held)} "
          f"ExcNodeList={excluded} NodeList={hostlist.compress(held)} BatchHost={spec.node_names[0]}")
    return 0


def _exclude(state: SimState, spec: JobSpec, value: str) -> int:
    if not state.requested("requeue"):  # as Slurm: only a pending job takes it
        print(f"Job is no longer pending execution for job {spec.job_id}", file=sys.stderr)
        return 1
    state.exclude(hostlist.expand(value) if value else [])
    return 0


def squeue(args: Sequence[str]) -> int:
    # Shape: squeue's arguments and formats, each refused by name where the simulator does not know it
    state = SimState.from_env()
    fmt = args[args.index("-o") + 1] if "-o" in args and args.index("-o") + 1 < len(args) else "%e"
    job = args[args.index("-j") + 1] if "-j" in args and args.index("-j") + 1 < len(args) else None
    if job is not None and job != str(state.read_job()[0].job_id):
        # The simulator knows only its own job: "cannot tell" (not Slurm's "Invalid job id", which would say the
        # other job ended and let the checkpoint lease be taken from a simulated job that still runs).
        print(f"squeue (slurmrt sim): only job {state.read_job()[0].job_id} is known here", file=sys.stderr)
        return 1
    if fmt == "%T":
        print("RUNNING")
        return 0
    if fmt not in ("%e", "%S %e"):
        print(f"squeue (slurmrt sim): unsupported format {fmt!r}; only -o %e, -o '%S %e' and -o %T", file=sys.stderr)
        return 1
    end = _end_time(state)
    said = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)) if end else "N/A"
    if fmt == "%S %e":  # this run's start: when the simulator started its batch script
        said = f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(state.read_job()[1]['started']))} {said}"
    print(said)
    return 0


def scancel(args: Sequence[str]) -> int:
    state = SimState.from_env()
    job = str(state.read_job()[0].job_id)
    others = [a for a in args if not a.startswith("-") and a != job]
    if others:  # the guard jobs of earlier runs (pending, or gone once they ran)
        unknown = [a for a in others if not guards.cancel(state, a)]
        for name in unknown:
            print(f"scancel: error: Kill job error on job id {name}: Invalid job id specified", file=sys.stderr)
        return 1 if unknown else 0
    state.request("cancel")
    return 0


def sbatch(args: Sequence[str]) -> int:
    """Only a guard job: ``sbatch --dependency=afternotok:JOB ... --wrap COMMAND`` on the simulated job."""
    state = SimState.from_env()
    job = str(state.read_job()[0].job_id)
    wrap = list(args).index("--wrap") + 1 if "--wrap" in args else None
    if f"--dependency=afternotok:{job}" not in args or wrap is None or wrap >= len(args):
        print(f"sbatch (slurmrt sim): unsupported: {shlex.join(args)} (only a job on --dependency=afternotok:{job}"
              " with --wrap)", file=sys.stderr)
        return 1
    print(guards.submit(state, args[wrap]))
    return 0


def sinfo(args: Sequence[str]) -> int:
    """Only the node count of the job's partition: ``sinfo -h -p PARTITION -o %D``."""
    spec, _ = SimState.from_env().read_job()
    partition = args[args.index("-p") + 1] if "-p" in args and args.index("-p") + 1 < len(args) else None
    fmt = args[args.index("-o") + 1] if "-o" in args and args.index("-o") + 1 < len(args) else None
    if partition != "sim" or fmt != "%D":
        print(f"sinfo (slurmrt sim): unsupported: {shlex.join(args)} (only -p sim -o %D)", file=sys.stderr)
        return 1
    print(max(PARTITION_NODES, 2 * spec.nodes))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {"scontrol": scontrol, "squeue": squeue, "scancel": scancel, "sbatch": sbatch, "sinfo": sinfo}
    return commands[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
