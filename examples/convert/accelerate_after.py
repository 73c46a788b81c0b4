"""An Accelerate loop, launched with `accelerate launch accelerate_after.py` under srun (one launcher per node)."""

import time

import torch
from accelerate import Accelerator

import slurmrt


def main() -> None:
    rt = slurmrt.init(checkpoint_dir="ckpt")  # first: before Accelerator()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    got = rt.load_latest()  # (step, directory) of the newest complete checkpoint, or None
    if got is not None:
        accelerator.load_state(str(got[1]))
        start = got[0] + 1
    for step in range(start, 200):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + accelerator.process_index))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        time.sleep(0.02)  # a real model's step
        if rt.should_stop(step):  # the warning signal, SIGTERM, the deadline, the kill switch: one step, all ranks
            rt.save(accelerator.save_state, step=step)  # every process writes into one directory, then it commits
            break
        if step % 50 == 49:
            rt.save(accelerator.save_state, step=step)
    rt.exit()  # requeues when it makes sense; the exit code says why it stopped


if __name__ == "__main__":
    main()
