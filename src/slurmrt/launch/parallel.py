"""The job's shape as the user declares it, in one object: nodes, GPUs per node, parallel sizes, FSDP, MoE overlap.

:func:`slurmrt.init` builds it once from its options (or Megatron-LM's command line) and the environment; the launch
checks (:mod:`.preflight`) and the ``CUDA_DEVICE_MAX_CONNECTIONS`` rule (:mod:`.cuda`) both read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._env import get_int
from .._errors import CudaConnectionsError, ParallelismError

__all__ = ["ParallelConfig"]

_MEGATRON_SIZES = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp",
}
_MEGATRON_FSDP = {"--use-torch-fsdp2", "--use-megatron-fsdp"}


@dataclass(frozen=True)
class ParallelConfig:
    #: Nodes the job should run on (``NNODES`` in sbatch scripts); None: not declared, not checked.
    nnodes: int | None = None
    #: GPUs each node should give the job (``GPUS_PER_NODE``); None: not declared.
    gpus_per_node: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    #: Torch-FSDP2 or Megatron-FSDP.
    fsdp: bool = False
    #: Megatron's ``overlap_moe_expert_parallel_comm``.
    moe_overlap: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp"):
            value = getattr(self, name)
            if value < 1:
                raise ParallelismError(f"{name}={value}: parallel sizes must be >= 1", **{name: value})

    @classmethod
    def declared(cls, env: Mapping[str, str], *, megatron_args: Sequence[str] | None = None,
                 **fields: Any) -> ParallelConfig:
        """What the user declared: ``fields``, then Megatron-LM's command line in place of the parallel sizes when
        given, then ``NNODES`` / ``GPUS_PER_NODE`` from ``env`` for nodes and GPUs left undeclared."""
        config = cls(**fields)
        if megatron_args is not None:
            config = config.with_megatron_args(megatron_args)
        return config.with_environment(env)

    @property
    def model_parallel(self) -> int:
        """TP x PP x CP: the ranks one model replica spans."""
        return self.tp * self.pp * self.cp

    def with_environment(self, env: Mapping[str, str]) -> ParallelConfig:
        """Fill what was not declared from ``NNODES`` and ``GPUS_PER_NODE``, the names sbatch scripts use."""
        return replace(
            self,
            nnodes=self.nnodes if self.nnodes is not None else get_int(env, "NNODES", minimum=1),
            gpus_per_node=self.gpus_per_node if self.gpus_per_node is not None else get_int(env, "GPUS_PER_NODE"),
        )

    def with_megatron_args(self, argv: Sequence[str]) -> ParallelConfig:
        """The parallel sizes and flags read off Megatron-LM's command line (``--flag N`` and ``--flag=N``), in place
        of this config's; nodes and GPUs per node stay."""
        values: dict[str, int] = {}
        fsdp = moe = False
        args = list(argv)
        for i, arg in enumerate(args):
            name, eq, inline = arg.partition("=")
            if name in _MEGATRON_SIZES:
                raw = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
                try:
                    values[_MEGATRON_SIZES[name]] = int(raw)
                except ValueError:
                    raise CudaConnectionsError(
                        f"Megatron argument {name} needs an integer, got {raw!r}", argument=name, value=raw
                    ) from None
            elif name in _MEGATRON_FSDP:
                fsdp = True
            elif name == "--overlap-moe-expert-parallel-comm":
                moe = True
        return ParallelConfig(nnodes=self.nnodes, gpus_per_node=self.gpus_per_node, fsdp=fsdp, moe_overlap=moe,
                              **values)
