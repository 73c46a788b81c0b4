"""The Hugging Face Trainer with slurmrt: a tiny GPT-2 on synthetic tokens, stopped, committed, requeued, resumed.

The three slurmrt lines are marked. Everything else is a plain Trainer script. The model is built from a config and
the data is generated from a seed, so nothing is downloaded. One process per device: `srun` (one task per GPU, see
train.sbatch) or `slurmrt sim` on a laptop:

    slurmrt sim -N 1 --ntasks-per-node 2 --preempt-at 20 --signal USR1 --grace 30 --requeue -- \
        python examples/transformers/train.py --output-dir /tmp/hf-out --checkpoint-dir /tmp/hf-ckpt
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import slurmrt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True, help="the Trainer's output_dir (every node must see it)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLURMRT_CHECKPOINT_DIR"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-steps", default="10",
                        help="save every N steps, or 'auto': when slurmrt says it pays (rt.should_save)")
    parser.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: never)")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated work per step")
    parser.add_argument("--weights-out", help="rank 0 writes the final weights here (torch.save of the state dict)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace, callbacks: list[Any] | None = None) -> tuple[Any, Any]:
    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir)  # slurmrt 1/3: first, before anything touches CUDA
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from slurmrt.integrations.transformers import SlurmrtCallback

    cpu = not torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4, learning_rate=1e-3,
        save_strategy="no" if args.save_steps == "auto" else "steps",
        save_steps=None if args.save_steps == "auto" else int(args.save_steps),
        eval_strategy="steps" if args.eval_steps else "no", eval_steps=args.eval_steps or None,
        logging_steps=10, report_to="none", disable_tqdm=True, seed=0, use_cpu=cpu,
        full_determinism=not cpu,  # on a GPU, deterministic kernels: a resumed run ends bitwise where one run does
        ddp_backend="gloo" if cpu else None, ddp_find_unused_parameters=False, dataloader_num_workers=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                                bos_token_id=0, eos_token_id=0))
    auto = "auto" if args.save_steps == "auto" else None  # "auto": save when rt.should_save says
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(512, seed=1), eval_dataset=Tokens(64, seed=2),
                      callbacks=[*(callbacks or []), SimulatedWork(args.step_time),
                                 SlurmrtCallback(rt, save_every=auto)])  # slurmrt 2/3
    return rt, trainer


def SimulatedWork(seconds: float) -> Any:  # noqa: N802 (a callback class, made where transformers is imported)
    """Sleeps ``seconds`` after each step: a step as long as a real model's, for rehearsals."""
    from transformers import TrainerCallback

    class Work(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if seconds:
                time.sleep(seconds)

    return Work()


class Tokens:
    """Random token sequences from a seed: a language-modelling dataset that needs no download."""

    def __init__(self, n: int, seed: int, length: int = 32) -> None:
        import torch

        self.ids = torch.randint(0, 128, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None, callbacks: list[Any] | None = None) -> None:
    args = parse_args(argv)
    rt, trainer = build(args, callbacks)
    from slurmrt.integrations.transformers import resume_from

    trainer.train(resume_from_checkpoint=resume_from(rt))  # slurmrt 3/3, with rt.exit() below
    if rt.stop_reason is None and rt.rank == 0:
        weights = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
        checksum = sum(float(v.double().sum()) for v in weights.values())
        slurmrt.printflock(f"finished {trainer.state.global_step} steps, weights checksum {checksum:.10f}")
        if args.weights_out:
            import torch

            torch.save(weights, args.weights_out)
    rt.exit()


if __name__ == "__main__":
    main()
