"""``init()`` and the :class:`Runtime` it returns: a thin facade over parts that each stand alone.

``init()`` reads and checks the launch (:mod:`slurmrt.launch`), takes the checkpoint directory's lease, and builds
the parts: the stop controller (:mod:`.controller`), the hang monitor (:mod:`slurmrt.hang.monitor`), the checkpoint
session (:mod:`.session`), the reporter (:mod:`.report`) and the process-global hooks (:mod:`.hooks`).
The Runtime forwards the training loop's calls to them; how a run ends is :func:`slurmrt.recovery.conclude.conclude`.
``docs/architecture.md`` walks one step, one stop, one save and one hang through them.
"""

from __future__ import annotations

from .facade import Runtime
from .startup import init

__all__ = ["Runtime", "init"]
