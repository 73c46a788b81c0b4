"""slurmrt driving Megatron-LM's own exit mechanism, through the real wrapper (examples/megatron/
pretrain_with_slurmrt.py) and 2 gloo ranks. Megatron-LM needs GPUs, so the script it runs here is a stand-in that
does what Megatron-LM's training loop does (megatron/training/training.py): a handler for SIGTERM that only records,
an all_gather of "received?" every iteration, a save of the iteration and its tracker file, then sys.exit(0); and
the --exit-duration-in-mins check, all-reduced (MAX). What is tested is slurmrt's side: the signal reaches the
stand-in's handler on every rank, all ranks stop at the same iteration, and the exit code and requeue follow."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from .launch import ROOT, start, wait_all

pytestmark = pytest.mark.timeout(240)

WRAPPER = ROOT / "examples" / "megatron" / "pretrain_with_slurmrt.py"

STAND_IN = textwrap.dedent('''
    """Megatron-LM's exit mechanism, in miniature."""
    import argparse, json, os, signal, sys, time
    import torch, torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--save")
    p.add_argument("--exit-signal-handler", action="store_true")
    p.add_argument("--exit-duration-in-mins", type=int)
    p.add_argument("--train-iters", type=int, default=100000)
    args = p.parse_args()
    received = []
    if args.exit_signal_handler:
        signal.signal(signal.SIGTERM, lambda s, f: received.append(s))
    dist.init_process_group("gloo")
    start = time.time()
    rank = dist.get_rank()
    for iteration in range(1, args.train_iters + 1):
        time.sleep(0.05)
        if iteration == 5:
            open(f"{args.save}/ready-{rank}", "w").close()
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, bool(received))
        exit_now = any(flags)
        if args.exit_duration_in_mins:
            done = torch.tensor([int((time.time() - start) / 60 > args.exit_duration_in_mins)])
            dist.all_reduce(done, op=dist.ReduceOp.MAX)
            exit_now = exit_now or bool(done.item())
        if exit_now:
            if rank == 0:
                with open(f"{args.save}/latest_checkpointed_iteration.txt", "w") as f:
                    f.write(str(iteration))
            with open(f"{args.save}/stop-{rank}.json", "w") as f:
                json.dump({"iteration": iteration, "args": sys.argv[1:]}, f)
            sys.exit(0)
''')


def _run(tmp_path: Path, action: str) -> tuple[list[int], list[dict[str, object]], str]:
    (tmp_path / "save").mkdir()
    stand_in = tmp_path / "pretrain_stand_in.py"
    stand_in.write_text(STAND_IN)
    extra = {"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURM_JOB_END_TIME": str(int(time.time()) + 7200)}
    if action == "kill_switch":
        extra["SLURMRT_KILL_SWITCH"] = str(tmp_path / "STOP")
    procs = start(2, tmp_path, [str(stand_in), "--save", str(tmp_path / "save")], script=WRAPPER, extra=extra)
    deadline = time.monotonic() + 180
    while not all((tmp_path / "save" / f"ready-{r}").exists() for r in range(2)):
        assert all(p.poll() is None for p in procs), [(tmp_path / f"rank{r}.log").read_text() for r in range(2)]
        assert time.monotonic() < deadline, "the stand-in never reached iteration 5"
        time.sleep(0.05)
    if action == "kill_switch":
        (tmp_path / "STOP").touch()
    else:
        for p in procs:  # Slurm's --signal=USR1@N: every task of the step
            os.kill(p.pid, signal.SIGUSR1)
    codes = wait_all(procs, 120)
    stops = [json.loads((tmp_path / "save" / f"stop-{r}.json").read_text()) for r in range(2)]
    calls = (tmp_path / "slurm-calls.log").read_text() if (tmp_path / "slurm-calls.log").exists() else ""
    return codes, stops, calls


def test_a_warning_signal_makes_megatron_save_and_exit_then_the_job_requeues(tmp_path: Path) -> None:
    codes, stops, calls = _run(tmp_path, "signal")
    assert codes == [3, 3], [(tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(2)]
    assert stops[0]["iteration"] == stops[1]["iteration"], "every rank stopped at the same iteration"
    args = stops[0]["args"]
    assert "--exit-signal-handler" in args and "--exit-duration-in-mins" in args
    minutes = int(args[args.index("--exit-duration-in-mins") + 1])
    assert 115 <= minutes <= 119, "two hours left, less the margin and the save time, in whole minutes"
    assert "requeue 4242" in calls
    events = [json.loads(line) for line in next((tmp_path / "ckpt").glob("events-*.jsonl")).read_text().splitlines()]
    (decision,) = [e for e in events if e["event"] == "decision"]
    assert decision["reasons"] == ["signal"] and decision["step"] == stops[0]["iteration"]


def test_the_kill_switch_makes_megatron_save_and_exit_with_code_zero_and_no_requeue(tmp_path: Path) -> None:
    codes, stops, calls = _run(tmp_path, "kill_switch")
    assert codes == [0, 0], [(tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(2)]
    assert stops[0]["iteration"] == stops[1]["iteration"]
    assert "requeue" not in calls
