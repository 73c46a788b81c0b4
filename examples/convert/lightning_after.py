"""A Lightning script, launched with `srun python lightning_after.py` (one task per device)."""

import time

import lightning as L
import torch

import slurmrt
from slurmrt.integrations.lightning import SlurmrtCallback, SlurmrtEnvironment, resume_from


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(0.05)  # a real model's step
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    rt = slurmrt.init(checkpoint_dir="ckpt")  # first, before anything touches CUDA
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=rt.local_world_size, num_nodes=rt.nnodes, strategy="ddp",
                        max_steps=100, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        plugins=[SlurmrtEnvironment(rt)], callbacks=[SlurmrtCallback(rt, every_n_steps=20)])
    trainer.fit(Regressor(), data, ckpt_path=resume_from(rt))  # the newest complete checkpoint, or None
    rt.exit()  # requeues when it makes sense; the exit code says why it stopped


if __name__ == "__main__":
    main()
