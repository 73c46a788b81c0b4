"""One experiment across requeues: W&B, MLflow and TensorBoard continue the same run after a requeue.

The quickstart's training loop, with rank 0 logging the loss of every step to the trackers it is given. Each
tracker is optional and imported only when asked for:

    python train.py --checkpoint-dir ckpt --wandb-dir wandb-logs --mlflow-uri file:$PWD/mlruns --tensorboard-dir tb

After a requeue the resumed run logs into the same W&B run (the experiment id is its run id), the same MLflow run
(its id is kept next to the checkpoints), and TensorBoard drops what the stopped run logged after the checkpoint
(purge_step). `--kill-at STEP` rehearses a crash: the last rank SIGKILLs itself after that step of the first run, so
the steps since the last checkpoint are lost and trained again.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import slurmrt
from slurmrt import trackers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated work per step")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLURMRT_CHECKPOINT_DIR"))
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--wandb-dir", help="log to W&B (offline on a compute node: WANDB_MODE=offline)")
    parser.add_argument("--wandb-project", default="slurmrt-example")
    parser.add_argument("--mlflow-uri", help="log to MLflow at this tracking URI")
    parser.add_argument("--tensorboard-dir", help="log to TensorBoard in this directory")
    parser.add_argument("--kill-at", type=int, help="rehearse a crash: the last rank dies after this step of run 0")
    args = parser.parse_args()

    rt = slurmrt.init(checkpoint_dir=args.checkpoint_dir)
    import torch
    import torch.distributed as dist

    if rt.world_size > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    got = rt.load_latest()
    if got is not None:
        model.load_state_dict(got[1]["model"])
        optim.load_state_dict(got[1]["optim"])
    start = trackers.first_step(rt)  # 0, or the checkpoint's step + 1

    log = Trackers(rt, args) if rt.rank == 0 else None
    step = start - 1
    for step in range(start, args.steps):
        with rt.time_compute():  # this rank's own work, no collective: a slow node is named a straggler
            g = torch.Generator().manual_seed(step * 1000 + rt.rank)
            x = torch.randn(32, 16, generator=g)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            optim.zero_grad()
            loss.backward()
        if rt.world_size > 1:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= rt.world_size
        optim.step()
        if log is not None:
            log.scalar("loss", loss.item(), step)
        if args.step_time:
            time.sleep(args.step_time)
        if args.kill_at == step and rt.restart_count == 0 and rt.rank == rt.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a node failure, as far as the job can tell
        if rt.should_stop(step):
            rt.save({"model": model.state_dict(), "optim": optim.state_dict()}, step=step)
            break
        if args.save_every and step % args.save_every == args.save_every - 1:
            rt.save({"model": model.state_dict(), "optim": optim.state_dict()}, step=step)
    else:
        rt.save({"model": model.state_dict(), "optim": optim.state_dict()}, step=step)
        if rt.rank == 0:
            checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
            slurmrt.printflock(f"finished {args.steps} steps, weights checksum {checksum:.10f}")
    if log is not None:
        log.close()
    rt.exit()


class Trackers:
    """The trackers rank 0 logs to, each set up to continue the experiment's run."""

    def __init__(self, rt: slurmrt.Runtime, args: argparse.Namespace) -> None:
        self.wandb = self.mlflow = self.tensorboard = None
        if args.wandb_dir:
            import wandb

            os.makedirs(args.wandb_dir, exist_ok=True)
            self.wandb = wandb.init(project=args.wandb_project, dir=args.wandb_dir, **trackers.wandb_args(rt))
        if args.mlflow_uri:
            import mlflow

            mlflow.set_tracking_uri(args.mlflow_uri)
            trackers.mlflow_start_run(rt)
            self.mlflow = mlflow
        if args.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(args.tensorboard_dir, purge_step=trackers.tensorboard_purge_step(rt))

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.wandb is not None:
            self.wandb.log({name: value}, step=step)
        if self.mlflow is not None:
            self.mlflow.log_metric(name, value, step=step)
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(name, value, step)
            self.tensorboard.flush()  # what a crash would otherwise lose, for the example's curves

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()
        if self.tensorboard is not None:
            self.tensorboard.close()


if __name__ == "__main__":
    main()
