"""A minimal slurmrt training script: topology, agreed stop, atomic checkpoint, requeue, resume.

Runs anywhere: alone (`python train.py`), under torchrun, under `srun`, or under `slurmrt sim`. Training is
deterministic -- the batch of step s on rank r depends only on (s, r) -- so a run that was stopped and resumed ends
with exactly the weights of an uninterrupted run. It prints a checksum of them at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import slurmrt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated work per step (a sleep)")
    parser.add_argument("--compute-time", type=float, default=0.0,
                        help="seconds of CPU work per step inside rt.time_compute(): what a slowed node "
                             "(slurmrt sim --slow-node) makes slower, for a straggler rehearsal")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLURMRT_CHECKPOINT_DIR"))
    parser.add_argument("--save-every", default="0",
                        help="non-blocking save every N steps (0: never), or 'auto': when rt.should_save() says, "
                             "from the measured save time and the job's failure rate")
    parser.add_argument("--trace", help="append 'rank step restart' per trained step to this file")
    args = parser.parse_args()

    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir)  # before anything touches CUDA
    import torch
    import torch.distributed as dist

    if rt.world_size > 1:
        dist.init_process_group("gloo")  # env:// -- slurmrt exported RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        check = torch.tensor([float(rt.rank)])
        dist.all_reduce(check)
        expected = rt.world_size * (rt.world_size - 1) / 2
        assert check.item() == expected, (check.item(), expected)
    slurmrt.printflock(
        f"rank {rt.rank}/{rt.world_size} local {rt.local_rank}/{rt.local_world_size} node {rt.node_rank}/{rt.nnodes} "
        f"master {rt.master_addr}:{rt.master_port} job {rt.job_id} restart {rt.restart_count}"
    )

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if args.checkpoint_dir:
        got = rt.load_latest()
        if got is not None:
            step, state = got
            model.load_state_dict(state["model"])
            optim.load_state_dict(state["optim"])
            start = step + 1
            if rt.rank == 0:
                slurmrt.printflock(f"resuming after step {step}")

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    step = start - 1
    for step in range(start, args.steps):
        if rt.skip(step):  # rewound past a fault that came back (rt.check): this step's batch is not trained on
            continue
        with rt.time_compute():  # this rank's own work, no collective: a slow node is named a straggler
            g = torch.Generator().manual_seed(step * 1000 + rt.rank)
            x = torch.randn(32, 16, generator=g)
            y = x.sum(dim=1, keepdim=True)
            loss = ((model(x) - y) ** 2).mean()
            optim.zero_grad()
            loss.backward()
            spin = time.thread_time()
            while time.thread_time() - spin < args.compute_time:  # CPU work that leaves the model as it is
                pass
        # A NaN or a spike on any rank, or a replica that differs from the others (compared every health_hash_every
        # steps), stops every rank here, before the update.
        rt.check(step, loss=loss.item(), replicas=model)
        if rt.world_size > 1:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= rt.world_size
        optim.step()
        if args.trace:
            with open(args.trace, "a") as f:
                f.write(f"{rt.rank} {step} {rt.restart_count}\n")
        if args.step_time:
            time.sleep(args.step_time)
        if rt.should_stop(step):  # the same answer on every rank, at the same step
            if args.checkpoint_dir:
                rt.save(state(), step=step)  # blocking; skipped when SIGTERM leaves no time for it
            slurmrt.printflock(f"stopping at step {step}: {rt.stop_reason.value if rt.stop_reason else ''}")
            break
        if args.checkpoint_dir and args.save_every == "auto":
            tier = rt.should_save(step)  # "shared", "local" (with a local tier) or None; the same on every rank
            if tier:
                rt.save(state(), step=step, blocking=tier == "local", tier=tier)
        elif args.checkpoint_dir and int(args.save_every) and step % int(args.save_every) == int(args.save_every) - 1:
            rt.save(state(), step=step, blocking=False)
    else:
        if args.checkpoint_dir:
            rt.save(state(), step=step)
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        if rt.rank == 0:
            slurmrt.printflock(f"finished {args.steps} steps, weights checksum {checksum:.10f}")
    rt.exit()  # requeue when it makes sense; the exit code says why the run ended


if __name__ == "__main__":
    main()
