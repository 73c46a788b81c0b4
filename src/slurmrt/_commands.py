"""The inspection commands behind ``slurmrt env``, ``doctor``, ``kill`` and ``status`` (cli.py parses, this acts)."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from . import cuda, hostlist, preflight
from ._errors import ConfigError, SlurmrtError
from .deadline import end_time_from_env, query_end_time
from .events import read_events
from .topology import from_environ, master_port_for


def env_exports(env: Mapping[str, str], config: cuda.ParallelConfig, gpus_per_node: int | None,
                arch_major: int | None) -> list[str]:
    """Shell lines for an sbatch script: what torchrun/accelerate and the training script need."""
    job = env.get("SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise ConfigError("slurmrt env runs inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset): "
                          "call it from the sbatch script or inside salloc")
    hosts = hostlist.expand(nodelist)
    nnodes = len(hosts)
    gpus = gpus_per_node if gpus_per_node is not None else cuda.node_gpu_count(env)
    world = nnodes * gpus if gpus else int(env.get("SLURM_NTASKS") or nnodes)
    port = env.get("MASTER_PORT") or str(master_port_for(job, "0"))
    lines = [
        f"export MASTER_ADDR={env.get('MASTER_ADDR') or hosts[0]}",
        f"export MASTER_PORT={port}",
        f"export NNODES={nnodes}",
        f"export GPUS_PER_NODE={gpus or 0}",
        f"export WORLD_SIZE={world}",
    ]
    if arch_major is None:
        lines.append("# CUDA_DEVICE_MAX_CONNECTIONS: no GPU visible here, left unset")
    else:
        value = cuda.decide(env, arch_major, config)
        current = env.get(cuda.VARIABLE)
        if value is not None:
            lines.append(f"export {cuda.VARIABLE}={value}")
        elif current is not None:
            lines.append(f"# {cuda.VARIABLE}={current} already exported and agrees with the rules")
        else:
            lines.append(f"unset {cuda.VARIABLE}  # the rules say: leave it to the driver")
    return lines


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = False

    def ok(self, what: str, text: str) -> None:
        self.lines.append(f"  ok    {what}: {text}")

    def warn(self, what: str, text: str) -> None:
        self.lines.append(f"  warn  {what}: {text}")

    def fail(self, what: str, text: str) -> None:
        self.failed = True
        self.lines.append(f"  FAIL  {what}: {text}")


def doctor(env: Mapping[str, str], config: cuda.ParallelConfig, *, events_dirs: Iterable[Path]) -> Report:
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
    try:
        preflight.check(topo, preflight.declared_from(env, nnodes=None, gpus_per_node=None, tp=config.tp,
                                                      pp=config.pp, cp=config.cp), node_gpus=gpus)
        r.ok("preflight", "node count, GPUs and parallel sizes agree")
    except ConfigError as err:
        r.fail("preflight", str(err))
    try:
        address = socket.gethostbyname(topo.master_addr)
        r.ok("master", f"{topo.master_addr} resolves to {address}, port {topo.master_port}")
    except OSError as err:
        r.fail("master", f"{topo.master_addr} does not resolve ({err}): the rendezvous cannot start")
    if topo.job_id:
        end = end_time_from_env(env) or query_end_time(topo.job_id)
        if end is None:
            r.ok("time", "no time limit known (unlimited job, or squeue unavailable)")
        else:
            left = end - datetime.now().timestamp()
            (r.ok if left > 600 else r.warn)("time", f"{left / 60:.1f} min left (ends {datetime.fromtimestamp(end)})")
        _requeue_check(r, topo.job_id)
    else:
        r.warn("slurm", "not inside a Slurm job: time limit and requeue not checked")
    save_s = _max_save_seconds(events_dirs)
    if save_s is None:
        r.ok("signal", "no save measured yet (no event log): use --signal=USR1@120 or more")
    else:
        lead = max(60, math.ceil(2 * save_s + 60))
        r.ok("signal", f"the slowest save took {save_s:.1f} s: use --signal=USR1@{lead} (or more) so a save fits "
                       "even when Slurm's warning comes late")
    arch = cuda.gpu_arch_major() if gpus else None
    if arch is None:
        r.ok("gpu", "no GPU visible: CUDA_DEVICE_MAX_CONNECTIONS not relevant")
    else:
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
    try:
        shm = shutil.disk_usage("/dev/shm").total
        (r.ok if shm >= 2**30 else r.warn)("/dev/shm", f"{shm / 2**30:.1f} GiB (NCCL and data loaders use it; "
                                                       "below 1 GiB they fail in odd ways)")
    except OSError:
        r.warn("/dev/shm", "missing: NCCL falls back or fails; mount a tmpfs there")
    return r


def _requeue_check(r: Report, job_id: str) -> None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        r.warn("requeue", "scontrol not found: slurmrt will exit 75 to ask the batch script to requeue")
        return
    out = subprocess.run([scontrol, "show", "job", job_id], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    if "Requeue=1" in out:
        r.ok("requeue", "the job can be requeued")
    elif "Requeue=0" in out:
        r.warn("requeue", "the job cannot be requeued: add `#SBATCH --requeue`")
    else:
        r.warn("requeue", "could not tell whether the job can be requeued")


def _event_files(dirs: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            files.extend(sorted(d.glob("events*.jsonl")) + sorted(d.glob("*/events*.jsonl")))
    return files


def _max_save_seconds(dirs: Iterable[Path]) -> float | None:
    seconds = [float(e["seconds"]) for f in _event_files(dirs) for e in read_events(f) if e.get("event") == "save"]
    return max(seconds) if seconds else None


def kill(path: Path, *, events_dirs: Iterable[Path]) -> list[str]:
    """Create the kill switch; return the jobs whose event logs say they watch it."""
    if not path.parent.is_dir():
        raise SlurmrtError(f"cannot create kill switch {path}: directory {path.parent} does not exist")
    path.touch()
    target = str(path.resolve())
    watchers = []
    for f in _event_files(events_dirs):
        for e in read_events(f):
            if e.get("event") == "init" and e.get("kill_switch") == target:
                watchers.append(f"job {e.get('job')} (restart {e.get('restart')}, started {e.get('time')})")
    return watchers


def status(dirs: Iterable[Path]) -> list[str]:
    files = _event_files(dirs)
    if not files:
        raise SlurmrtError(f"no event log (events-*.jsonl) in {', '.join(str(d) for d in dirs)}")
    out: list[str] = []
    for f in files:
        events = [e for e in read_events(f) if e.get("rank") in (0, None)]
        runs: dict[int, list[dict[str, Any]]] = {}
        for e in events:
            runs.setdefault(int(e.get("restart", 0)), []).append(e)
        job = events[0].get("job") if events else f.stem
        out.append(f"job {job}: {len(runs)} run(s), {max(runs, default=0)} restart(s)  [{f}]")
        previous_end: float | None = None
        for restart, evs in sorted(runs.items()):
            start, end = _ts(evs[0]), _ts(evs[-1])
            saves = [e for e in evs if e["event"] == "save"]
            decision = next((e for e in evs if e["event"] == "decision"), None)
            exit_event = next((e for e in evs if e["event"] == "exit"), None)
            resumed = next((e.get("step") for e in evs if e["event"] == "resume"), None)
            lost = []
            if previous_end is not None:
                lost.append(f"{start - previous_end:.0f} s down between runs")
            if exit_event is None:
                lost.append(f"{end - (_ts(saves[-1]) if saves else start):.0f} s of work after the last checkpoint "
                            "(the run ended without a clean exit)")
            parts = [
                f"resumed after step {resumed}" if resumed is not None else "fresh start",
                f"stopped at step {decision['step']} ({', '.join(decision['reasons'])})" if decision else "no stop",
                f"last checkpoint step {saves[-1]['step']}" if saves else "last checkpoint none",
                f"exit {exit_event['outcome']}" if exit_event else "no exit recorded",
            ]
            if lost:
                parts.append(f"lost: {', '.join(lost)}")
            out.append(f"  run {restart}: {'; '.join(parts)}")
            previous_end = end
    return out


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def signal_training(sig: int, job_id: str | None) -> list[int]:
    """Send ``sig`` to this node's training processes of the job (those registered by slurmrt.init())."""
    import psutil

    from .registry import process_dir

    signalled = []
    directory = process_dir(job_id)
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        pid = int(entry.name) if entry.name.isdigit() else -1
        if pid <= 0 or not psutil.pid_exists(pid):
            entry.unlink(missing_ok=True)  # a process that died without close()
            continue
        os.kill(pid, sig)
        signalled.append(pid)
    return signalled


def default_dirs(env: Mapping[str, str]) -> list[Path]:
    return [Path(env["SLURMRT_CHECKPOINT_DIR"])] if env.get("SLURMRT_CHECKPOINT_DIR") else [Path(os.getcwd())]
