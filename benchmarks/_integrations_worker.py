"""One rank of bench_integrations: the same Trainer, with and without slurmrt's callback, in alternating rounds.

argv: framework steps rounds. Prints {"with": s/step, "without": s/step} as its last line."""

from __future__ import annotations

import json
import runpy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import slurmrt

WARMUP = 10


def main() -> None:
    framework, steps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rt = slurmrt.init(deadline=False, progress_s=None)
    measure = transformers_round if framework == "transformers" else lightning_round
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(rounds):
        for key in ("without", "with"):
            times[key].append(measure(rt, steps, key == "with"))
    rt.close()
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}))


def _example(framework: str) -> dict[str, Any]:
    """The example's definitions (its main() does not run)."""
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / framework / "train.py"))


def _median_step(stamps: list[float]) -> float:
    gaps = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1:], strict=False)]
    return statistics.median(gaps)


def transformers_round(rt: Any, steps: int, with_callback: bool) -> float:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from slurmrt.integrations.transformers import SlurmrtCallback

    stamps: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    Tokens = _example("transformers")["Tokens"]  # noqa: N806

    args = TrainingArguments(output_dir="/tmp/slurmrt-bench-hf", max_steps=steps, per_device_train_batch_size=4,
                             save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
                             ddp_backend="gloo", ddp_find_unused_parameters=False, logging_strategy="no", seed=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    callbacks = [Clock(), *([SlurmrtCallback(rt)] if with_callback else [])]
    Trainer(model=model, args=args, train_dataset=Tokens(512, seed=1), callbacks=callbacks).train()
    return _median_step(stamps)


def lightning_round(rt: Any, steps: int, with_callback: bool) -> float:
    import lightning as L
    import torch

    from slurmrt.integrations.lightning import SlurmrtCallback, SlurmrtEnvironment

    SyntheticBatches = _example("lightning")["SyntheticBatches"]  # noqa: N806

    stamps: list[float] = []

    class Clock(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, *args: Any) -> None:
            stamps.append(time.perf_counter())

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    callbacks = [Clock(), *([SlurmrtCallback(rt)] if with_callback else [])]
    trainer = L.Trainer(accelerator="cpu", devices=rt.local_world_size, num_nodes=rt.nnodes, max_steps=steps,
                        strategy="ddp", use_distributed_sampler=False, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        plugins=[SlurmrtEnvironment(rt)], callbacks=callbacks)
    trainer.fit(Model(), SyntheticBatches(steps + 1, rank=rt.rank, world=rt.world_size, seed=1))
    return _median_step(stamps)


if __name__ == "__main__":
    main()
