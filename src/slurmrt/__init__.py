"""slurmrt: PyTorch training jobs that survive SLURM.

``rt = slurmrt.init()`` derives the topology from SLURM, checks the launch, installs signal recorders; then
``rt.should_stop(step)``, ``rt.save(...)``, ``rt.load_latest()`` and ``rt.exit()`` carry the run through preemption,
time limits, ``scancel`` and kill switches. Importing this package imports neither torch nor anything heavy.
"""

from __future__ import annotations

from . import cuda, hostlist
from ._errors import (
    AgreementError,
    CheckpointError,
    ConfigError,
    CudaConnectionsError,
    CudaInitializedError,
    EnvironmentVariableError,
    GpuCountError,
    HostlistError,
    LauncherConflictError,
    NodeCountError,
    NodeRankError,
    ParallelismError,
    SlurmrtError,
)
from .agreement import Reason, StopDecision
from .log import FlockHandler, printflock
from .options import Options
from .requeue import ExitCode
from .runtime import Runtime, init
from .topology import LaunchMode, Topology

__version__ = "0.1.0"

__all__ = [
    "AgreementError",
    "CheckpointError",
    "ConfigError",
    "CudaConnectionsError",
    "CudaInitializedError",
    "EnvironmentVariableError",
    "ExitCode",
    "FlockHandler",
    "GpuCountError",
    "HostlistError",
    "LaunchMode",
    "LauncherConflictError",
    "NodeCountError",
    "NodeRankError",
    "Options",
    "ParallelismError",
    "Reason",
    "Runtime",
    "SlurmrtError",
    "StopDecision",
    "Topology",
    "__version__",
    "cuda",
    "hostlist",
    "init",
    "printflock",
]
