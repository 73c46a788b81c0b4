"""A Lightning script, launched with `srun python lightning_before.py` (Lightning's own SLURM support)."""

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


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
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_steps=100, logger=False,
                        enable_progress_bar=False,
                        callbacks=[ModelCheckpoint(dirpath="ckpt", every_n_train_steps=20, save_last=True)])
    trainer.fit(Regressor(), data, ckpt_path="last")


if __name__ == "__main__":
    main()
