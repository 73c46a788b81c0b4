"""Lightning with slurmrt: a tiny model from a config, synthetic data, stopped, committed, requeued, resumed.

The slurmrt lines are marked; the rest is a plain Lightning script. One process per device, started by the launch:
`srun` with one task per GPU (see train.sbatch), or `slurmrt sim` on a laptop:

    slurmrt sim -N 1 --ntasks-per-node 2 --preempt-at 20 --signal USR1 --grace 30 --requeue -- \
        python examples/lightning/train.py --checkpoint-dir /tmp/pl-ckpt

The data loader is resumable (``state_dict``/``load_state_dict``): Lightning then restores the position inside the
epoch, and a run stopped mid-epoch resumes at the next batch, not at the start of the epoch.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import slurmrt

CONFIG = {"inputs": 16, "width": 32, "depth": 2, "lr": 0.05}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLURMRT_CHECKPOINT_DIR"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", default="10",
                        help="save every N steps, or 'auto': when slurmrt says it pays (rt.should_save)")
    parser.add_argument("--batches-per-epoch", type=int, default=25)
    parser.add_argument("--val-every", type=int, default=0, help="validate every N training batches (0: never)")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated work per step")
    parser.add_argument("--weights-out", help="rank 0 writes the final weights here (torch.save of the state dict)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, callbacks: list[Any] | None = None) -> None:
    args = parse_args(argv)
    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir)  # slurmrt 1/4: first, before anything touches CUDA
    import lightning as L
    import torch

    from slurmrt.integrations.lightning import SlurmrtCallback, SlurmrtEnvironment, resume_from

    class Regressor(L.LightningModule):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)
            layers: list[torch.nn.Module] = []
            width = config["inputs"]
            for _ in range(config["depth"]):
                layers += [torch.nn.Linear(width, config["width"]), torch.nn.Tanh()]
                width = config["width"]
            self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            if args.step_time:
                time.sleep(args.step_time)  # a step as long as a real model's, for rehearsals
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])

    torch.manual_seed(0)
    model = Regressor(CONFIG)
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=rt.local_world_size, num_nodes=rt.nnodes, max_steps=args.steps,
        strategy="ddp" if rt.world_size > 1 else "auto", use_distributed_sampler=False,
        val_check_interval=args.val_every or None, limit_val_batches=4 if args.val_every else 0,
        check_val_every_n_epoch=None if args.val_every else 1, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_checkpointing=False, logger=False, deterministic=True,
        plugins=[SlurmrtEnvironment(rt)],  # slurmrt 2/4: the topology
        callbacks=[*(callbacks or []), SlurmrtCallback(rt, save_every=_every(args.save_every))],  # slurmrt 3/4
    )
    train = SyntheticBatches(args.batches_per_epoch, rank=rt.rank, world=rt.world_size, seed=1)
    val = SyntheticBatches(4, rank=rt.rank, world=rt.world_size, seed=2)
    trainer.fit(model, train, val, ckpt_path=resume_from(rt))  # slurmrt 4/4, with rt.exit() below
    if rt.stop_reason is None and rt.rank == 0:
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        checksum = sum(float(v.double().sum()) for v in weights.values())
        slurmrt.printflock(f"finished {trainer.global_step} steps, weights checksum {checksum:.10f}")
        if args.weights_out:
            torch.save(weights, args.weights_out)
    rt.exit()


class SyntheticBatches:
    """Batches of (x, sum of x) from a seed, a different shard per rank, in an order that changes every epoch.

    Resumable: Lightning saves ``state_dict()`` with its checkpoints and calls ``load_state_dict()`` on resume, so a
    run stopped mid-epoch goes on with the next batch. The batch of (epoch, index) on a rank is always the same."""

    def __init__(self, batches: int, *, rank: int, world: int, seed: int, size: int = 32) -> None:
        self.batches, self.rank, self.world, self.seed, self.size = batches, rank, world, seed, size
        self.epoch = 0
        self.index = 0  # the next batch of the epoch

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Any:
        import torch

        order = torch.randperm(self.batches, generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        while self.index < self.batches:
            i = int(order[self.index])
            self.index += 1
            g = torch.Generator().manual_seed(((self.seed * 1000 + self.epoch) * 1000 + i) * 100 + self.rank)
            x = torch.randn(self.size, 16, generator=g)
            yield x, x.sum(dim=1, keepdim=True)
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def _every(value: str) -> int | str:
    """``--save-every``: a number of steps, or "auto" (rt.should_save)."""
    return value if value == "auto" else int(value)


if __name__ == "__main__":
    main()
