"""slurmrt: PyTorch training jobs that survive SLURM.

``rt = slurmrt.init()`` derives the topology from SLURM, checks the launch, installs signal recorders; then
``rt.should_stop(step)``, ``rt.save(...)``, ``rt.load_latest()`` and ``rt.exit()`` carry the run through preemption,
time limits, ``scancel`` and kill switches.

Importing this package imports neither torch nor anything heavy: the names below other than the exceptions load
their module on first use (``slurmrt.init`` loads the runtime), so a module that only wants ``printflock`` or an
exception class pays for nothing else.
"""

from __future__ import annotations

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
    LeaseError,
    NodeCountError,
    NodeRankError,
    ParallelismError,
    SlurmrtError,
    TrainingHealthError,
    UnsafePathError,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from typing import Any

    from . import log, trackers
    from .checkpoint.background import Staged
    from .launch import cuda, hostlist
    from .launch.parallel import ParallelConfig
    from .launch.topology import LaunchMode, Topology
    from .log import FlockHandler, printflock
    from .options import Options
    from .recovery.policy import ExitCode, Outcome
    from .runtime import Runtime, init
    from .runtime.inprocess import run_restartable
    from .stop.decision import Reason, StopDecision

#: Public name -> the module that defines it (a module's own name: the module itself).
_LAZY = {
    "cuda": ".launch.cuda",
    "hostlist": ".launch.hostlist",
    "ParallelConfig": ".launch.parallel",
    "Staged": ".checkpoint.background",
    "LaunchMode": ".launch.topology",
    "Topology": ".launch.topology",
    "FlockHandler": ".log",
    "log": ".log",
    "printflock": ".log",
    "Options": ".options",
    "ExitCode": ".recovery.policy",
    "Outcome": ".recovery.policy",
    "Runtime": ".runtime",
    "init": ".runtime",
    "run_restartable": ".runtime.inprocess",
    "Reason": ".stop.decision",
    "StopDecision": ".stop.decision",
    "trackers": ".trackers",
}


def __getattr__(name: str) -> Any:
    source = _LAZY.get(name)
    if source is None:
        raise AttributeError(f"module 'slurmrt' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(source, __name__)
    value = module if source.endswith("." + name) else getattr(module, name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "LeaseError",
    "NodeCountError",
    "NodeRankError",
    "Options",
    "Outcome",
    "ParallelConfig",
    "ParallelismError",
    "Reason",
    "Runtime",
    "SlurmrtError",
    "Staged",
    "StopDecision",
    "Topology",
    "TrainingHealthError",
    "UnsafePathError",
    "__version__",
    "cuda",
    "hostlist",
    "init",
    "log",
    "printflock",
    "run_restartable",
    "trackers",
]
