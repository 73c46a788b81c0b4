"""A training script as a user of ``slurmrt.run_restartable`` writes it: a small model trained with gloo
all-reduces, saved every few steps to the shared tier and every step to the local one, built and loaded inside the
training function (``--every auto``: where ``rt.should_save`` says).

``--fail G:R:S`` (repeatable): in generation G, rank R raises after step S's update (a software fault: the process
lives); G may be ``*`` (every generation). ``--kill G:R:S``: that rank's process dies there (SIGKILL).
``--nan G:R:S``: that rank's loss of step S is NaN, which ``rt.check`` (called every step, before the update) finds;
``--spike G:R:S``: that rank's loss of step S spikes (a batch that causes it: give G ``*``);
the loop skips the batches ``rt.skip`` names (a rewind past a fault that came back), and those of ``--skip A-B``
(the comparator: an uninterrupted run that skips them).
Rank 0 writes the final weights to ``--out`` and, per generation, the pid that ran it (one process throughout, or the
restart was not in the process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import slurmrt
from slurmrt.health.replicas import flip_bit

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--every", default="5", help="shared saves every N steps and local ones every step, or auto: "
                    "rt.should_save says when and where")
parser.add_argument("--fail", action="append", default=[])
parser.add_argument("--kill", action="append", default=[], help="G:R:S, as --fail, but SIGKILL: the process dies")
parser.add_argument("--nan", action="append", default=[], help="G:R:S, as --fail: that rank's loss is NaN there")
parser.add_argument("--flip", action="append", default=[], help="G:R:S, as --fail: a bit of that rank's weights flips "
                    "before step S (silent: no NaN)")
parser.add_argument("--spike", action="append", default=[], help="G:R:S, as --fail: that rank's loss spikes there")
parser.add_argument("--replicas", action="store_true", help="rt.check compares the replicas' hashes")
parser.add_argument("--skip", help="A-B: the batches of steps A to B are skipped, as after a rewind")
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--rejoin-timeout", type=float, default=60.0)
parser.add_argument("--max-restarts", type=int, default=3)
parser.add_argument("--step-time", type=float, default=0.0)
parser.add_argument("--ready", type=Path, help="touched by rank 0 at the first step of a restarted generation")
args = parser.parse_args()

rt = slurmrt.init()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

seen: list[dict[str, object]] = []


def due(specs: list[str], generation: int, step: int) -> bool:
    if rt.topology.attempt or rt.topology.restart_count:  # a fault comes once: not again in a new step or run
        return False
    parsed = [spec.split(":") for spec in specs]
    return any(g in ("*", str(generation)) and int(r) == rt.rank and int(s) == step for g, r, s in parsed)


def skipped(step: int) -> bool:
    if args.skip is None:
        return False
    first, last = map(int, args.skip.split("-"))
    return first <= step <= last


def train(generation: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    got = rt.load_latest()
    start = 0
    if got is not None:
        step, state = got
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = step + 1
    seen.append({"generation": generation, "pid": os.getpid(), "start": start,
                 "resumed": rt.resumed_step})
    for step in range(start, args.steps):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + rt.rank))
        if rt.skip(step) or skipped(step):
            continue
        loss = (model(x) - 1.0).pow(2).mean()
        if due(args.nan, generation, step):
            print(f"worker: fault nan on rank {rt.rank} at {time.time():.6f}", flush=True)
            loss = loss * float("nan")
        if due(args.spike, generation, step):
            print(f"worker: fault spike on rank {rt.rank} at {time.time():.6f}", flush=True)
            loss = loss.abs() * 100 + 1000
        if due(args.flip, generation, step):
            print(f"worker: fault flip on rank {rt.rank} at {time.time():.6f}", flush=True)
            assert flip_bit(list(model.parameters()))
        # Before the update: every rank stops here when any rank's loss (or with --replicas, copy) is bad.
        rt.check(step, loss=loss.item(), replicas=model if args.replicas else None)
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= rt.world_size
        opt.step()
        opt.zero_grad()
        if step == start:  # the first step of this generation (or process): when training was back
            print(f"worker: first step {step} of generation {generation} done at {time.time():.6f}", flush=True)
            if args.ready is not None and generation > 0 and rt.rank == 0:
                args.ready.touch()
        time.sleep(args.step_time)
        if due(args.fail, generation, step):
            print(f"worker: fault raise on rank {rt.rank} at {time.time():.6f}", flush=True)
            raise RuntimeError(f"injected fault at step {step}")
        if due(args.kill, generation, step):
            print(f"worker: fault kill on rank {rt.rank} at {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        state = {"model": model.state_dict(), "opt": opt.state_dict()}
        if rt.should_stop(step):
            rt.save(state, step=step)
            break
        if args.every == "auto":
            tier = rt.should_save(step)
            if tier:
                rt.save(state, step=step, blocking=tier == "local", tier=tier)
            continue
        rt.save(state, step=step, tier="local")
        if step % int(args.every) == 0:
            rt.save(state, step=step)
    return model


model = slurmrt.run_restartable(rt, train, max_in_process_restarts=args.max_restarts,
                                rejoin_timeout_s=args.rejoin_timeout)
if rt.rank == 0:
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "weights.pt")
    (args.out / "generations.json").write_text(json.dumps(seen))
sys.stdout.flush()
rt.exit()
