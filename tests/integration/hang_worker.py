"""A gloo training loop in which rank 1 goes wrong at step --at, the way real jobs do (tests/integration/test_hang.py).

--mode sleep:  rank 1 stops in user code; the others block in the step's all_reduce.
--mode kill:   rank 1 dies of SIGKILL; the others' all_reduce fails.
--mode fifo:   a save at --at; rank 1's write never returns (it opens a named pipe nobody reads: a stalled filesystem).
--mode switch: as sleep; the test creates the kill switch while rank 1 is stuck.
--mode phase:  nothing goes wrong: every 20 steps rank 0 evaluates for --eval-s, much longer than a step, in
               rt.phase("eval"), while the other ranks wait for it in a barrier.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import slurmrt


def write_to_stalled_fs(fifo: Path, directory: Path) -> None:
    with open(fifo, "wb") as f:  # a pipe nobody reads: open() never returns
        f.write(b"never")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["sleep", "kill", "fifo", "switch", "phase", "raise"], required=True)
    p.add_argument("--at", type=int, default=30)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-s", type=float, default=4.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rt = slurmrt.init()
    dist.init_process_group("gloo")
    w = torch.zeros(4)
    for step in range(a.steps):
        evaluates = a.mode == "phase" and step % 20 == 19
        if rt.should_stop(step, before="eval" if evaluates else None):
            break
        if step == a.at and rt.rank == 1 and a.mode in ("sleep", "switch"):
            (a.out / "stuck").touch()
            threading.Event().wait()  # never returns
        if step == a.at and rt.rank == 1 and a.mode == "raise":
            raise RuntimeError("a bug of the script's own")
        if step == a.at and rt.rank == 1 and a.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if step == a.at and a.mode == "fifo":
            rt.save(functools.partial(write_to_stalled_fs, a.out / "stalled-fs") if rt.rank == 1 else {"w": w},
                    step=step)
        t = torch.ones(4)
        dist.all_reduce(t)
        w += t
        time.sleep(0.05)
        if evaluates:
            with rt.phase("eval"):
                if rt.rank == 0:
                    time.sleep(a.eval_s)
                dist.barrier()
    (a.out / f"done{rt.rank}").touch()
    rt.exit()


if __name__ == "__main__":
    main()
