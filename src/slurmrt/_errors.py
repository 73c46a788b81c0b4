"""The exceptions slurmrt raises.

One base, :class:`SlurmrtError`; each subclass also derives from the built-in whose meaning it shares, so that
``except ValueError`` in user code still catches a bad configuration. Every message names the value seen, the rule
it broke, and the fix.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from typing import Any


class SlurmrtError(Exception):
    """Base of every error slurmrt raises."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        #: The values behind the message (variable names, counts), for programs that handle the error.
        self.details: dict[str, Any] = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword details do not survive the default Exception pickling, which replays only ``args``.
        return (_rebuild, (type(self), str(self), self.details))


def _rebuild(cls: type[SlurmrtError], message: str, details: dict[str, Any]) -> SlurmrtError:
    return cls(message, **details)


class ConfigError(SlurmrtError, ValueError):
    """The launch, the environment or the options are inconsistent; raised before any rendezvous."""


class TrainingHealthError(SlurmrtError, ArithmeticError):
    """A rank's loss or gradient norm was not finite, or its loss spiked (``rt.check``): raised on every rank at the
    same step, before the optimizer step. ``details``: ``step``, ``rank`` (the first rank that found it), ``what``
    (``"nonfinite"`` or ``"spike"``)."""


class HostlistError(ConfigError):
    """A Slurm hostlist expression that ``scontrol show hostnames`` would reject."""


class EnvironmentVariableError(ConfigError):
    """A SLURM or launcher variable is present but malformed (not an integer, out of range)."""


class LauncherConflictError(ConfigError):
    """A launcher (torchrun, accelerate) and SLURM disagree about the topology."""


class NodeCountError(ConfigError):
    """The declared number of nodes differs from the allocation's."""


class NodeRankError(ConfigError):
    """A node rank disagrees with ``SLURM_NODEID``: usually ``$SLURM_PROCID`` expanded in the batch shell."""


class GpuCountError(ConfigError):
    """Declared GPUs per node, tasks per node and visible GPUs do not fit together."""


class ParallelismError(ConfigError):
    """The world size is not divisible by TP x PP x CP."""


class CudaConnectionsError(ConfigError):
    """``CUDA_DEVICE_MAX_CONNECTIONS`` is set to a value the rules forbid for this job."""


class CudaInitializedError(SlurmrtError, RuntimeError):
    """CUDA was initialised before ``slurmrt.init()`` could set ``CUDA_DEVICE_MAX_CONNECTIONS``."""


class AgreementError(SlurmrtError, RuntimeError):
    """The ranks could not agree on a stop decision (a peer died or the control group broke)."""


class CheckpointError(SlurmrtError, OSError):
    """A checkpoint could not be written or committed; the previous checkpoint is intact."""


class UnsafePathError(SlurmrtError, PermissionError):
    """A runtime file or directory is not this user's own (another owner, a mode open to others, a symlink)."""


class LeaseError(ConfigError):
    """The checkpoint directory is held by another live job: two jobs on one directory would destroy each other."""
