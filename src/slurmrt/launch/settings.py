"""The job's declared shape, as options: declared here once (each shape field an ``init()`` keyword and a
``SLURMRT_<NAME>`` variable of its own); :class:`slurmrt.options.Options` composes the sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._rules import Rule, Section, setting
from .parallel import ParallelConfig

__all__ = ["LaunchSection"]


@dataclass(frozen=True, kw_only=True)
class LaunchSection(Section):
    """The job's declared shape, for the launch checks and the CUDA rule."""

    #: Its fields are init() options of their own (``tp=2``, ``SLURMRT_TP``), and so is ``megatron_args``,
    #: Megatron-LM's command line, read in their place.
    parallel: ParallelConfig = setting(None, "value", factory=ParallelConfig)
    #: The rules of the shape's own options.
    SHAPE: ClassVar[dict[str, Rule]] = {
        "nnodes": Rule("count", 1), "gpus_per_node": Rule("count"), "tp": Rule("count", 1), "pp": Rule("count", 1),
        "cp": Rule("count", 1), "fsdp": Rule("flag"), "moe_overlap": Rule("flag"), "megatron_args": Rule("argv")}
