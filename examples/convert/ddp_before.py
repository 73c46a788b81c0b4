"""A plain DDP script, launched with `torchrun --nproc-per-node 4 ddp_before.py`."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists("ckpt.pt"):
        state = torch.load("ckpt.pt")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
    for step in range(start, 200):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + dist.get_rank()))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.02)  # a real model's step
        if step % 50 == 49 and dist.get_rank() == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, "ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
