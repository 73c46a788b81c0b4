"""Reading and checking the launch, before any rendezvous.

- :mod:`.topology`: rank, world, node rank, master address and port, from Slurm's and the launchers' variables.
- :mod:`.hostlist`: Slurm's hostlist expressions.
- :mod:`.parallel`: the job's declared shape (nodes, GPUs per node, TP/PP/CP, FSDP) in one object.
- :mod:`.preflight`: the checks that turn a 30-minute rendezvous hang into an error in seconds.
- :mod:`.cuda`: ``CUDA_DEVICE_MAX_CONNECTIONS``, its rule and the GPU facts it needs (NVML, no CUDA context).
"""
