"""Megatron-LM's pretrain_gpt.py, unmodified, under slurmrt: the launch checked, CUDA_DEVICE_MAX_CONNECTIONS set,
and slurmrt's reasons to stop (the warning signal, the deadline, the kill switch) driving Megatron's own exit.

    srun python examples/megatron/pretrain_with_slurmrt.py /path/to/Megatron-LM/pretrain_gpt.py <megatron args>

How the stop reaches Megatron without a patch (slurmrt.integrations.megatron):
- the deadline becomes --exit-duration-in-mins, from the job's real end time;
- a warning signal (USR1/USR2) or the kill switch makes slurmrt send SIGTERM to this process once, and Megatron's
  --exit-signal-handler (added here) saves and exits on every rank at the same iteration;
- afterwards rank 0 learns every rank's reasons, and exits and requeues as slurmrt's own stop would: exit 3 and
  requeued after a warning or the deadline, 0 for the kill switch, 4 for a scancel.
SIGTERM stays Megatron's: a SIGTERM from Slurm itself (the time limit, a preemption without warning) makes Megatron
save and exit too.
"""

from __future__ import annotations

import runpy
import signal
import sys
from pathlib import Path

import slurmrt
from slurmrt.integrations import megatron


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: pretrain_with_slurmrt.py PATH/TO/pretrain_gpt.py [megatron arguments]")
    script, megatron_args = sys.argv[1], sys.argv[2:]
    # Before Megatron touches CUDA. SIGTERM is left to Megatron's handler: slurmrt records the warnings and INT.
    rt = slurmrt.init(megatron_args=megatron_args, signals=(signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT))
    argv, duration_ends = megatron.megatron_argv(rt, megatron_args)
    if rt.rank == 0:
        minutes = argv[argv.index("--exit-duration-in-mins") + 1]
        slurmrt.printflock(f"{rt!r}, CUDA_DEVICE_MAX_CONNECTIONS={rt.cuda_device_max_connections or 'unset'}, "
                           f"--exit-signal-handler --exit-duration-in-mins {minutes}")
    bridge = megatron.StopBridge(rt).start()
    sys.argv = [script, *argv]
    exited_early = False
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise  # Megatron failed: its own exit code, and the batch script's requeue for crashes
        exited_early = True  # the early-exit path: its exit signal, --exit-duration-in-mins or --exit-interval
    code = megatron.finish(rt, bridge, exited_early=exited_early, duration_ends=duration_ends,
                           iteration=_last_saved_iteration(argv))
    raise SystemExit(int(code))


def _last_saved_iteration(argv: list[str]) -> int:
    """The iteration of Megatron's newest checkpoint (its tracker file in --save), or -1."""
    if "--save" not in argv:
        return -1
    tracker = Path(argv[argv.index("--save") + 1]) / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return -1


if __name__ == "__main__":
    main()
