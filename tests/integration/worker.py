"""A training worker for the integration tests: writes what happened to <out>/rank<R>.json.

Deterministic like the quickstart; extra knobs let a test provoke each failure mode.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import slurmrt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--save-every", type=lambda v: v if v == "auto" else int(v), default=0,
                   help="a background save every N steps, or 'auto': the tier rt.should_save() names")
    p.add_argument("--state-mb", type=float, default=0.0, help="extra tensor bytes per rank in each checkpoint")
    p.add_argument("--slow-save", type=float, default=0.0, help="seconds to sleep inside every save (callable)")
    p.add_argument("--ready", help="touch this file after the first step")
    p.add_argument("--pid-dir", help="write <rank>.pid here at start (for tests that kill one task)")
    p.add_argument("--resume-steps", type=int, default=0,
                   help="after a resume, finish this many steps later (a run that surely ends before its signal)")
    p.add_argument("--fault", choices=["hang", "kill"], help="in the first run, --fault-rank goes wrong at --fault-at")
    p.add_argument("--fault-at", type=lambda v: [int(s) for s in v.split(",")], default=[30],
                   help="the step; a list (35,55): the in-job attempts 0, 1, ... each go wrong at theirs")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--local-every", type=int, default=0, help="save to the node-local tier every N steps")
    p.add_argument("--die-at", type=int, help="in the first run, every rank dies (os._exit 9) at this step")
    p.add_argument("--die-by-kill", action="store_true", help="--die-at dies of SIGKILL, not os._exit(9)")
    p.add_argument("--compute", type=int, default=0,
                   help="Python loop iterations of work per step, in the timed section (a slowed node shows there)")
    p.add_argument("--checkpoint-dir", help="passed to init() in code, as the README's quickstart does")
    p.add_argument("--rank-env", action="append", default=[], metavar="R:KEY=VALUE",
                   help="set KEY=VALUE in rank R's environment before init() (SLURM_PROCID): one rank's own settings")
    p.add_argument("--block-on-cont", type=int, metavar="RANK",
                   help="on SIGCONT (woken from a freeze), RANK's main thread blocks for ever, where no collective "
                        "fails (as NCCL's wait on the GPU)")
    args = p.parse_args()
    for item in args.rank_env:
        rank, _, setting = item.partition(":")
        key, _, value = setting.partition("=")
        if os.environ.get("SLURM_PROCID") == rank:
            os.environ[key] = value
    if args.block_on_cont is not None and os.environ.get("SLURM_PROCID") == str(args.block_on_cont):
        signal.signal(signal.SIGCONT, lambda signum, frame: threading.Event().wait())
    rt = slurmrt.init(**({"checkpoint_dir": args.checkpoint_dir} if args.checkpoint_dir else {}))
    out = Path(args.out)
    if rt.in_job_restarts:  # a step `slurmrt run` started in the same run of the job, after an in-job restart
        out = out.with_name(f"{out.name}.{rt.in_job_restarts}")
    out.mkdir(parents=True, exist_ok=True)
    import torch
    import torch.distributed as dist

    if args.pid_dir:
        Path(args.pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.pid_dir) / f"{rt.rank}.pid").write_text(str(os.getpid()))
    if rt.world_size > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    w = torch.zeros(8)
    extra = torch.zeros(int(args.state_mb * 2**20 / 4))
    got = rt.load_latest() if os.environ.get("SLURMRT_CHECKPOINT_DIR") else None
    start = 0
    if got is not None:
        step, state = got
        if isinstance(state, Path):  # a save of --slow-save's own (slurmrt.Staged): its directory, read here
            state = torch.load(state / f"rank_{rt.rank:05d}.pt")
        w = state["w"]
        start = step + 1
        if args.resume_steps:
            args.steps = start + args.resume_steps
    trained = []
    stopped_at = None
    step = start - 1

    def save(step: int, blocking: bool = True) -> bool:
        state = {"w": w.clone(), "extra": extra, "step": step}
        if args.slow_save:  # a save function, in the two parts a background save takes
            def write(snapshot: dict[str, object], directory: Path) -> None:
                time.sleep(args.slow_save)
                torch.save(snapshot, directory / f"rank_{rt.rank:05d}.pt")
            return rt.save(slurmrt.Staged(lambda: state, write), step=step, blocking=blocking)
        return rt.save(state, step=step, blocking=blocking)

    for step in range(start, args.steps):
        if args.fault and rt.rank == args.fault_rank and rt.restart_count == 0 \
                and rt.in_job_restarts < len(args.fault_at) and step == args.fault_at[rt.in_job_restarts]:
            print(f"worker: fault {args.fault} on rank {rt.rank} at {time.time():.6f}", file=sys.stderr, flush=True)
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Event().wait()  # hangs: the other ranks block in the all_reduce below
        if args.die_at is not None and step == args.die_at and rt.restart_count == 0 and not got:
            if args.die_by_kill:  # the OOM killer, say: srun reports 128 + 9
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(9)  # the allocation is gone: nothing more is written
        with rt.time_compute():  # every test's run looks for stragglers; the conftest fails one that names any
            g = torch.Generator().manual_seed(step * 1000 + rt.rank)
            grad = torch.randn(8, generator=g)
            busy = 0
            for i in range(args.compute):
                busy += i
        if rt.world_size > 1:
            dist.all_reduce(grad)
        w -= 0.01 * grad
        trained.append(step)
        time.sleep(args.step_time)
        if args.ready and step == start:
            Path(args.ready).touch()
        if rt.should_stop(step):
            stopped_at = step
            saved = save(step) if os.environ.get("SLURMRT_CHECKPOINT_DIR") else False
            break
        tier = rt.should_save(step) if args.save_every == "auto" else None
        if tier == "local":
            rt.save({"w": w.clone(), "extra": extra, "step": step}, step=step, tier="local")
        elif tier == "shared" or (args.save_every != "auto" and args.save_every
                                  and step % args.save_every == args.save_every - 1):
            save(step, blocking=False)
        elif args.local_every and step % args.local_every == args.local_every - 1:
            rt.save({"w": w.clone(), "extra": extra, "step": step}, step=step, tier="local")
    else:
        saved = save(step) if os.environ.get("SLURMRT_CHECKPOINT_DIR") else False
    result = {
        "rank": rt.rank,
        "world_size": rt.world_size,
        "start": start,
        "trained": trained,
        "stopped_at": stopped_at,
        "reasons": sorted(r.value for r in rt.stop_decision.reasons) if rt.stop_decision else [],
        "saved": saved,
        "w": w.tolist(),
        "pid": os.getpid(),
        "local_rank": rt.local_rank,
        "node_rank": rt.node_rank,
        "local_world_size": rt.local_world_size,
        "nnodes": rt.nnodes,
        "master_addr": rt.master_addr,
        "master_port": rt.master_port,
        "env_master_addr": os.environ.get("MASTER_ADDR"),
        "hostname": rt.topology.hostname,
        "restart_count": rt.restart_count,
        "in_job_restarts": rt.in_job_restarts,
        "straggler": rt.straggler,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_"))},
    }
    # Written before finish() too: a requeue ends every task of the job, and then nothing after finish() runs.
    # Each write replaces the file whole: the requeue's SIGTERM, once finish() gave the handler back, must not
    # leave it half-written.
    _write_json(out / f"rank{rt.rank}.json", {**result, "exit_code": None})
    code = rt.finish()
    result["exit_code"] = int(code)
    _write_json(out / f"rank{rt.rank}.json", result)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(int(code))


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
