"""A plain DDP script, launched with `srun python ddp_after.py` (one task per GPU)."""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import slurmrt


def main() -> None:
    rt = slurmrt.init(checkpoint_dir="ckpt")  # first; exports RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    got = rt.load_latest()  # the newest complete checkpoint, the same on every rank
    if got is not None:
        step, state = got
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = step + 1
    for step in range(start, 200):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + dist.get_rank()))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.02)  # a real model's step
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        if rt.should_stop(step):  # the warning signal, SIGTERM, the deadline, the kill switch: one step, all ranks
            rt.save(state, step=step)
            break
        if step % 50 == 49:
            rt.save(state, step=step, blocking=False)  # atomic: complete or absent
    rt.exit()  # requeues when it makes sense; the exit code says why it stopped


if __name__ == "__main__":
    main()
