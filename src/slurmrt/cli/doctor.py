"""``slurmrt doctor``: a preflight report from inside an allocation.

Checks the derived topology, the master address and port, the time left, whether the job can be requeued, the
--signal lead time against the measured save time, GPUs and CUDA_DEVICE_MAX_CONNECTIONS, and /dev/shm; with
``--health``, the node health check that ``init(health_check=True)`` runs. Exit 0:
nothing would break the job (warnings may remain); 1: something would.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import _slurm
from .._errors import ConfigError, NodeCountError
from ..launch import cuda, health, launchline, preflight
from ..launch.parallel import ParallelConfig
from ..launch.slurmvars import job_of
from ..launch.topology import Topology, from_environ
from ..options import Options, unknown_variables
from ..record.events import Event, read_events
from ..recovery.policy import ExitCode
from ..stop.deadline import end_time_from_env, query_end_time
from ._common import add_command, add_events, add_parallel, default_dirs, event_files, parallel
from ._json import add_flag, emit


def run(args: argparse.Namespace) -> int:
    if args.launch:
        return launch_gate(args.command[1:] if args.command[:1] == ["--"] else args.command, os.environ)
    dirs = args.events or default_dirs(os.environ)
    report = doctor(os.environ, parallel(args, os.environ), events_dirs=dirs, health_check=args.health)
    if args.json:
        emit("doctor", {"ok": not report.failed,
                        "checks": [{"check": c, "status": s, "text": t} for s, c, t in report.checks]})
    else:
        print("slurmrt doctor")
        print("\n".join(report.lines))
    return 1 if report.failed else 0


class Report:
    def __init__(self) -> None:
        #: (status: "ok", "warn" or "fail"; the check; what it found), in the order checked.
        self.checks: list[tuple[str, str, str]] = []

    @property
    def failed(self) -> bool:
        return any(status == "fail" for status, _, _ in self.checks)

    @property
    def lines(self) -> list[str]:
        return [f"  {'FAIL' if status == 'fail' else status:<4}  {what}: {text}" for status, what, text in self.checks]

    def ok(self, what: str, text: str) -> None:
        self.checks.append(("ok", what, text))

    def warn(self, what: str, text: str) -> None:
        self.checks.append(("warn", what, text))

    def fail(self, what: str, text: str) -> None:
        self.checks.append(("fail", what, text))


def doctor(env: Mapping[str, str], config: ParallelConfig, *, events_dirs: Iterable[Path],
           health_check: bool = False) -> Report:
    r = Report()
    try:
        topo = from_environ(env)
    except ConfigError as err:
        r.fail("topology", str(err))
        return r
    r.ok("topology", f"{topo.mode.value}: rank {topo.rank}/{topo.world_size}, local {topo.local_rank}/"
                     f"{topo.local_world_size}, node {topo.node_rank}/{topo.nnodes}, job {topo.job_id}")
    for warning in topo.warnings:
        r.warn("launch", warning)
    gpus = cuda.node_gpu_count(env)
    _launch_checks(r, env, topo, config, gpus)
    if topo.job_id:
        _time_check(r, env, topo.job_id)
        _requeue_check(r, topo.job_id)
    else:
        r.warn("slurm", "not inside a Slurm job: time limit and requeue not checked")
    _signal_check(r, events_dirs)
    _gpu_check(r, env, config, gpus)
    _shm_check(r)
    if health_check:
        _health_check(r, env, topo, gpus)
    return r


def _launch_checks(r: Report, env: Mapping[str, str], topo: Topology, config: ParallelConfig, gpus: int | None
                   ) -> None:
    try:
        preflight.check(topo, config, node_gpus=gpus)
        r.ok("preflight", "node count, GPUs and parallel sizes agree")
    except ConfigError as err:
        r.fail("preflight", str(err))
    try:
        address = socket.gethostbyname(topo.master_addr)
        r.ok("master", f"{topo.master_addr} resolves to {address}, port {topo.master_port}")
    except OSError as err:
        r.fail("master", f"{topo.master_addr} does not resolve ({err}): the rendezvous cannot start")
    try:
        Options.resolve({}, env)
        r.ok("options", "every SLURMRT_* option is well formed")
    except ConfigError as err:
        r.fail("options", f"{err}: init() refuses it")
    for name in unknown_variables(env):
        r.warn("options", f"{name} is set, but slurmrt reads no such variable (misspelt?)")


def _signal_check(r: Report, events_dirs: Iterable[Path]) -> None:
    save_s = _max_save_seconds(events_dirs)
    if save_s is None:
        r.ok("signal", "no save measured yet (no event log): use --signal=USR1@120 or more")
    else:
        lead = max(60, math.ceil(2 * save_s + 60))
        r.ok("signal", f"the slowest save took {save_s:.1f} s: use --signal=USR1@{lead} (or more) so a save fits "
                       "even when Slurm's warning comes late")


def _gpu_check(r: Report, env: Mapping[str, str], config: ParallelConfig, gpus: int | None) -> None:
    arch = cuda.gpu_arch_major() if gpus else None
    if arch is None:
        r.ok("gpu", "no GPU visible: CUDA_DEVICE_MAX_CONNECTIONS not relevant")
        return
    r.ok("gpu", f"{gpus} GPU(s), compute capability {arch}.x")
    try:
        value = cuda.decide(env, arch, config)
        shown = env.get(cuda.VARIABLE, "unset")
        if value is None:
            r.ok("cuda", f"{cuda.VARIABLE}={shown} agrees with the rules")
        else:
            r.warn("cuda", f"{cuda.VARIABLE}={shown}; slurmrt.init() will set {value} (or export it yourself)")
    except ConfigError as err:
        r.fail("cuda", str(err))


def _shm_check(r: Report) -> None:
    try:
        shm = shutil.disk_usage("/dev/shm").total
        (r.ok if shm >= 2**30 else r.warn)("/dev/shm", f"{shm / 2**30:.1f} GiB (NCCL and data loaders use it; "
                                                       "below 1 GiB they fail in odd ways)")
    except OSError:
        r.warn("/dev/shm", "missing: NCCL falls back or fails; mount a tmpfs there")


def _health_check(r: Report, env: Mapping[str, str], topo: Topology, gpus: int | None) -> None:
    ckpt = env.get("SLURMRT_CHECKPOINT_DIR")
    failures = health.check_node(env, checkpoint_dir=Path(ckpt) if ckpt else None, gpus=gpus or 0,
                                 local_rank=topo.local_rank)
    for failure in failures:
        r.fail("health", f"{topo.hostname}: {failure}; exclude it: sbatch --exclude={topo.hostname}")
    if not failures:
        r.ok("health", f"{topo.hostname}: /dev/shm{', the checkpoint directory' if ckpt else ''}"
                       f"{' and the GPU' if gpus else ''} pass slurmrt's health check")


def _time_check(r: Report, env: Mapping[str, str], job_id: str) -> None:
    try:
        end = end_time_from_env(env) or query_end_time(job_id)
    except ConfigError as err:
        r.fail("time", f"{err}: init() refuses it (ignoring it would turn the deadline off)")
        return
    if end is None:
        r.ok("time", "no time limit known (unlimited job, or squeue unavailable)")
        return
    left = end - datetime.now().timestamp()
    (r.ok if left > 600 else r.warn)("time", f"{left / 60:.1f} min left (ends {datetime.fromtimestamp(end)})")


def _requeue_check(r: Report, job_id: str) -> None:
    out = _slurm.run("scontrol", "show", "job", job_id)
    if isinstance(out, str):
        r.warn("requeue", f"{out}: slurmrt will exit 75 to ask the batch script to requeue")
    elif "Requeue=1" in out.stdout:
        r.ok("requeue", "the job can be requeued")
    elif "Requeue=0" in out.stdout:
        r.warn("requeue", "the job cannot be requeued: add `#SBATCH --requeue`")
    else:
        r.warn("requeue", "could not tell whether the job can be requeued")


def launch_gate(command: list[str], env: Mapping[str, str]) -> int:
    """``slurmrt doctor --launch [-- COMMAND]`` in a batch script, before a launcher per node starts: NNODES and the
    launcher's node count against the allocation's; one line and exit 78 when they differ."""
    job = job_of(env)
    if job is None or not job.nodes:
        raise ConfigError("slurmrt doctor --launch checks a launch in a Slurm job's batch script: no "
                          "SLURM_JOB_NODELIST here")
    try:
        launchline.check(command, env, nodes=len(job.nodes), where="the job has",
                         fix='NNODES=$SLURM_NNODES, and the launcher\'s node count from it (--nnodes "$NNODES", '
                             '--num_machines "$NNODES")')
    except NodeCountError as err:
        print(f"slurmrt doctor --launch: {err}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    print(f"slurmrt doctor --launch: ok: {len(job.nodes)} node(s), as NNODES and the launcher say (or leave open)")
    return 0


def _max_save_seconds(dirs: Iterable[Path]) -> float | None:
    seconds = [float(e["seconds"]) for f in event_files(dirs) for e in read_events(f)
               if e.get("event") == Event.SAVE.value and e.get("seconds") is not None]
    return max(seconds) if seconds else None


def add_parser(sub: Any) -> None:
    p = add_command(sub, "doctor", run, doc=__doc__,
                    help="preflight report inside an allocation; exit 1 if something would break the job",
                    epilog="example: srun --ntasks-per-node=1 slurmrt doctor --tp 2 --events /shared/ckpt/run17")
    add_parallel(p)
    add_events(p, "to read save times from")
    add_flag(p)
    p.add_argument("--launch", action="store_true",
                   help="only the launch gate, in the batch script before a launcher per node starts: NNODES and "
                        "the node count of the command after -- (torchrun --nnodes, accelerate launch "
                        "--num_machines) against the allocation; exit 78 with the fix when they differ")
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.add_argument("--health", action="store_true",
                   help="also run slurmrt's node health check (init(health_check=True)): /dev/shm, the checkpoint "
                        "directory ($SLURMRT_CHECKPOINT_DIR), a GPU allocation; run it on every node with "
                        "`srun --ntasks-per-node=1 slurmrt doctor --health`")
