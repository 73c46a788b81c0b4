"""Reading and checking the launch, before any rendezvous. Floor: the lowest folder, beside ``record/``; it imports
only slurmrt's private leaves.

- :mod:`.topology`: rank, world, node rank, master address and port, from Slurm's and the launchers' variables.
- :mod:`.slurmvars`: Slurm's variables for a step and its allocation (ranks, world, hosts, tasks per node), checked.
- :mod:`.launcher`: the launcher's command line (torchrun, accelerate), read from /proc.
- :mod:`.hostlist`: Slurm's hostlist expressions.
- :mod:`.ports`: the master port.
- :mod:`.parallel`: the job's declared shape (nodes, GPUs per node, TP/PP/CP, FSDP) in one object.
- :mod:`.preflight`: the checks that turn a 30-minute rendezvous hang into an error in seconds.
- :mod:`.cuda`: ``CUDA_DEVICE_MAX_CONNECTIONS``, its rule and the GPU facts it needs (NVML, no CUDA context).
- :mod:`.health`: the node health check.

``slurmrt run`` (the step supervisor) is recovery's: :mod:`slurmrt.recovery.supervisor`.
"""
