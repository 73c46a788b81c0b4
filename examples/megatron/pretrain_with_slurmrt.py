"""Start Megatron-LM's pretrain_gpt.py under slurmrt.

    srun python examples/megatron/pretrain_with_slurmrt.py /path/to/Megatron-LM/pretrain_gpt.py <megatron args>

slurmrt.init() runs first, before Megatron creates a CUDA context, so that:
- RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the srun step (one task per GPU);
- the launch is checked before any rendezvous (NNODES, GPUs per node, world size divisible by TP x PP x CP, read
  from Megatron's own flags);
- CUDA_DEVICE_MAX_CONNECTIONS follows the rules for --tensor-model-parallel-size, --context-parallel-size,
  --use-torch-fsdp2 / --use-megatron-fsdp and --overlap-moe-expert-parallel-comm.

Stopping stays Megatron's here: its training loop saves and exits on `--exit-signal-handler` (SIGTERM by default),
which train.sbatch sends early with `--signal=TERM@N`; the batch script requeues. Letting slurmrt's agreed stop drive
Megatron needs a call to `rt.should_stop(iteration)` inside Megatron's training loop, which this wrapper does not
patch in. Not run in this repository's CI: Megatron-LM needs GPUs and does not install here.
"""

from __future__ import annotations

import runpy
import sys

import slurmrt


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: pretrain_with_slurmrt.py PATH/TO/pretrain_gpt.py [megatron arguments]")
    script, megatron_args = sys.argv[1], sys.argv[2:]
    # Signals stay Megatron's (signals=()): its --exit-signal-handler installs its own SIGTERM handler.
    rt = slurmrt.init(megatron_args=megatron_args, deadline=False, signals=())
    if rt.rank == 0:
        slurmrt.printflock(f"{rt!r}, CUDA_DEVICE_MAX_CONNECTIONS={rt.cuda_device_max_connections or 'unset'}")
    sys.argv = [script, *megatron_args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        rt.close()


if __name__ == "__main__":
    main()
