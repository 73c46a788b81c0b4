"""Start N worker processes with the environment a real `srun` step gives (fakes sit at the process boundary)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_bin(directory: Path) -> Path:
    """`scontrol` and `scancel` that record their calls, `squeue` that answers $FAKE_END_TIME (local time, squeue's
    format; with ``-o "%S %e"``, $FAKE_START_TIME before it)."""
    directory.mkdir(parents=True, exist_ok=True)
    scontrol = directory / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\necho "$@" >> "$FAKE_SLURM_LOG"\n'
        'if [ "$1" = requeue ] && [ -n "$FAKE_REQUEUE_FAIL" ]; then echo "Job is not requeueable" >&2; exit 1; fi\n'
    )
    squeue = directory / "squeue"
    squeue.write_text(  # -o "%S %e": the run's start ($FAKE_START_TIME, or N/A) before the end, as squeue prints them
        '#!/bin/sh\necho "squeue $@" >> "$FAKE_SLURM_LOG"\n'
        'if [ -n "$FAKE_END_TIME" ]; then end=$(date -d "@$FAKE_END_TIME" +%Y-%m-%dT%H:%M:%S); else end=N/A; fi\n'
        'start=N/A; [ -z "$FAKE_START_TIME" ] || start=$(date -d "@$FAKE_START_TIME" +%Y-%m-%dT%H:%M:%S)\n'
        'case "$*" in *"%S %e"*) echo "$start $end" ;; *) echo "$end" ;; esac\n'
    )
    scancel = directory / "scancel"
    scancel.write_text('#!/bin/sh\necho "scancel $@" >> "$FAKE_SLURM_LOG"\n')
    for f in (scontrol, squeue, scancel):
        f.chmod(0o755)
    return directory


def step_env(rank: int, ntasks: int, tmp: Path, *, job_id: str = "4242", extra: Mapping[str, str] | None = None,
             port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                                    "MASTER_", "GROUP_", "TORCHELASTIC"))}
    env.update({
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "PATH": f"{fake_bin(tmp / 'bin')}{os.pathsep}{env['PATH']}",
        "FAKE_SLURM_LOG": str(tmp / "slurm-calls.log"),
        "SLURM_JOB_ID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": str(ntasks),
        "SLURMD_NODENAME": "localhost",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "SLURMRT_WATCH_INTERVAL_S": "0.2",
    })
    env.update(extra or {})
    return env


def two_node_env(rank: int, tmp: Path, nodes: tuple[str, str], *, port: int,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of rank ``rank`` of a 2-node x 2-task step on ``nodes`` (a real srun step's variables)."""
    node = rank // 2
    return step_env(rank, 4, tmp, port=port, extra={
        "SLURM_LOCALID": str(rank % 2), "SLURM_NODEID": str(node), "SLURMD_NODENAME": nodes[node],
        "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": ",".join(nodes), "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", **(extra or {})})


def start(ntasks: int, tmp: Path, args: list[str], *, extra: Mapping[str, str] | None = None,
          script: Path = WORKER, preexec: Mapping[int, Callable[[], None]] | None = None,
          ) -> list[subprocess.Popen[bytes]]:
    """Start ``ntasks`` ranks; ``preexec`` maps a rank to a function run in its child before exec."""
    port = free_port()
    procs = []
    for rank in range(ntasks):
        with open(tmp / f"rank{rank}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, str(script), *args],
                                          env=step_env(rank, ntasks, tmp, extra=extra, port=port),
                                          stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                          preexec_fn=(preexec or {}).get(rank)))
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes
