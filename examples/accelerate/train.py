"""Hugging Face Accelerate + slurmrt: Accelerate's own checkpoints, committed atomically by slurmrt.

Launched by `accelerate launch` (one launcher per node under srun, see train.sbatch), or under `slurmrt sim`:

    slurmrt sim --nodes 1 --time 1:00 --signal USR1@20 --requeue -- \
        accelerate launch --cpu --num_processes 2 examples/accelerate/train.py --checkpoint-dir /tmp/acc
"""

from __future__ import annotations

import argparse
import time

import slurmrt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--save-every", default="50",
                        help="save every N steps, or 'auto': when slurmrt says it pays (rt.should_save)")
    parser.add_argument("--weights-out", help="the main process writes the final weights here (torch.save)")
    args = parser.parse_args()

    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir)  # before Accelerate touches CUDA
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)

    start = 0
    got = rt.load_latest()  # a checkpoint written by a callable comes back as its directory
    if got is not None:
        step, directory = got
        accelerator.load_state(str(directory))
        start = step + 1
        accelerator.print(f"resuming after step {step}")

    step = start - 1
    for step in range(start, args.steps):
        if rt.skip(step):  # rewound past a fault that came back (rt.check): not this batch, and no timed work
            continue
        with rt.time_compute():  # the forward pass: this rank's own work (DDP's backward holds the all-reduce)
            g = torch.Generator().manual_seed(step * 1000 + accelerator.process_index)
            x = torch.randn(32, 16, generator=g).to(accelerator.device)  # drawn on the CPU: the same on a GPU
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        rt.check(step, loss=loss.item())  # a NaN or a spike on any rank stops every rank here, before the update
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        time.sleep(args.step_time)
        if rt.should_stop(step):
            rt.save(accelerator.save_state, step=step)  # every rank calls save_state into the same directory
            accelerator.print(f"stopping at step {step}: {rt.stop_reason.value if rt.stop_reason else ''}")
            break
        every = 0 if args.save_every == "auto" else int(args.save_every)
        if rt.should_save(step) if not every else step % every == every - 1:  # "auto": when the measured save
            rt.save(accelerator.save_state, step=step)  # time and the job's failure rate say it pays
    else:
        rt.save(accelerator.save_state, step=step)
        weights = accelerator.unwrap_model(model).weight.detach().sum().item()
        accelerator.print(f"finished {args.steps} steps, weight sum {weights:.6f}")
        if args.weights_out and accelerator.is_main_process:
            torch.save(accelerator.unwrap_model(model).state_dict(), args.weights_out)
    rt.exit()


if __name__ == "__main__":
    main()
