"""A Hugging Face Trainer script, launched with `torchrun --nproc-per-node 4 trainer_before.py`."""

import os
import time

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(0.02)  # a real model's step
        return {"loss": (self.linear(x).squeeze(-1) - labels).pow(2).mean()}


def main() -> None:
    g = torch.Generator().manual_seed(1)
    data = [{"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)} for _ in range(512)]
    args = TrainingArguments(output_dir="out", max_steps=200, save_steps=50, per_device_train_batch_size=4,
                             report_to="none", disable_tqdm=True, use_cpu=True, ddp_backend="gloo")
    torch.manual_seed(0)
    trainer = Trainer(model=Net(), args=args, train_dataset=data)
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)  # None on the first run: a fresh start


if __name__ == "__main__":
    main()
