"""A megatron-core GPT with tensor parallelism, trained under slurmrt: the agreed stop, the deadline and the kill
switch; Megatron's ``dist_checkpointing`` saved through slurmrt's commit; data position and RNG states resumed.

One process per GPU, started by ``torch.distributed.run`` on each node (see train_core.sbatch). On a machine
without GPUs the same script runs on gloo with the small adaptations of ``cpu_shims.py`` (the tests do this)::

    slurmrt sim -N 2 --ntasks-per-node 1 --requeue -- \\
        python -m torch.distributed.run --nnodes 2 --nproc-per-node 1 ... examples/megatron/train_core.py

A checkpoint ``step_N`` holds Megatron's sharded model (``model/``, loadable on another tensor-parallel layout by
``dist_checkpointing``) and one ``rank_R.pt`` per rank: the optimizer's shard of the state and the RNG states.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import slurmrt

SEED = 1234


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLURMRT_CHECKPOINT_DIR"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", default="10",
                        help="save every N steps, or 'auto': when slurmrt says it pays (rt.should_save)")
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated work per step")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--weights-out", help="each rank writes its final parameters to WEIGHTS_OUT.rank<R>")
    parser.add_argument("--losses-out", help="rank 0 appends 'step loss' for every step it trains")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # First, before CUDA: the launch is checked against TP (world size divisible by it), and
    # CUDA_DEVICE_MAX_CONNECTIONS is set by the rules for TP > 1.
    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir, tp=args.tp)
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(rt.local_rank)
    dist.init_process_group("nccl" if gpu else "gloo")  # env://: slurmrt or torchrun exported the rendezvous
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    if gpu:
        tensor_parallel.model_parallel_cuda_manual_seed(SEED)
        device: Any = torch.device("cuda", rt.local_rank)
        mask = None  # Megatron builds the causal mask itself on the GPU
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import cpu_shims

        cpu_shims.install(SEED)
        device = torch.device("cpu")
        mask = cpu_shims.causal_mask(args.seq)
    config = TransformerConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=4,
                               use_cpu_initialization=not gpu, params_dtype=torch.float32,
                               pipeline_dtype=torch.float32)
    model = GPTModel(config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=256,
                     max_sequence_length=args.seq).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    dp_group = parallel_state.get_data_parallel_group()

    def rng_state() -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state(), "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
        if gpu:
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def save(directory: Path) -> None:
        """Every rank calls it with the same directory: Megatron's sharded model into model/, then this rank's
        optimizer state and RNG states."""
        (directory / "model").mkdir(exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), str(directory / "model"))
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state()}, directory / f"rank_{rt.rank:05d}.pt")

    start = 0
    got = rt.load_latest()  # (step, directory) of the newest complete checkpoint, the same on every rank
    if got is not None:
        step, directory = got
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), str(directory / "model")))
        local = torch.load(directory / f"rank_{rt.rank:05d}.pt", weights_only=False)
        optimizer.load_state_dict(local["optimizer"])
        torch.set_rng_state(local["rng"]["cpu"])
        tensor_parallel.get_cuda_rng_tracker().set_states(local["rng"]["tracker"])
        if gpu:
            torch.cuda.set_rng_state(local["rng"]["cuda"])
        start = step + 1
        if rt.rank == 0:
            slurmrt.printflock(f"resuming after step {step}")

    positions = torch.arange(args.seq, device=device).unsqueeze(0).expand(args.batch, -1)
    step = start - 1
    for step in range(start, args.steps):
        # The batch of a step depends only on (step, data-parallel rank): the data position is the step.
        g = torch.Generator().manual_seed(step * 1000 + dp_rank)
        tokens = torch.randint(0, 256, (args.batch, args.seq), generator=g).to(device)
        if rt.skip(step):  # rewound past a fault that came back (rt.check): not this batch
            continue
        loss = model(tokens, positions, mask, labels=tokens).mean()
        # A NaN or a spike on any rank stops every rank here, before the update. Not replicas=model: under tensor
        # parallelism each rank holds its own shard, and shards differ by design.
        rt.check(step, loss=loss.item())
        optimizer.zero_grad()
        loss.backward()
        if dp_size > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_group)
                    p.grad /= dp_size
        optimizer.step()
        if args.losses_out and rt.rank == 0:
            with open(args.losses_out, "a") as f:
                f.write(f"{step} {loss.item():.10f}\n")
        if args.step_time:
            time.sleep(args.step_time)
        if rt.should_stop(step):  # the same answer on every rank, at the same step
            rt.save(save, step=step)  # skipped when SIGTERM leaves no time for it
            slurmrt.printflock(f"stopping at step {step}: {rt.stop_reason.value if rt.stop_reason else ''}")
            break
        every = 0 if args.save_every == "auto" else int(args.save_every)
        if rt.should_save(step) if args.save_every == "auto" else every and step % every == every - 1:
            rt.save(save, step=step)  # "auto": when the measured save time and the failure rate say it pays
    else:
        rt.save(save, step=step)
        if rt.rank == 0:
            slurmrt.printflock(f"finished {args.steps} steps, loss {loss.item():.6f}")
        if args.weights_out:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items() if v is not None},
                       f"{args.weights_out}.rank{rt.rank}")
    rt.exit()


if __name__ == "__main__":  # Megatron's checkpoint writer spawns helpers, which import this file again
    main()
