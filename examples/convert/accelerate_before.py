"""An Accelerate loop, launched with `accelerate launch accelerate_before.py`."""

import time
from pathlib import Path

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    if Path("ckpt/step.txt").exists():
        accelerator.load_state("ckpt")
        start = int(Path("ckpt/step.txt").read_text()) + 1
    for step in range(start, 200):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 100 + accelerator.process_index))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        time.sleep(0.02)  # a real model's step
        if step % 50 == 49:
            accelerator.save_state("ckpt")
            if accelerator.is_main_process:
                Path("ckpt/step.txt").write_text(str(step))


if __name__ == "__main__":
    main()
