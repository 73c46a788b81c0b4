"""``init()`` and the :class:`Runtime` it returns: a thin facade over parts that each stand alone.

``init()`` reads and checks the launch (:mod:`slurmrt.launch`), takes the checkpoint directory's lease, and builds
the parts: the stop controller (:mod:`.controller`), the hang monitor (:mod:`slurmrt.hang.monitor`), the checkpoint
session (:mod:`.session`), the reporter (:mod:`.report`) and the process-global hooks (:mod:`.hooks`).
The Runtime forwards the training loop's calls to them; how a run ends is :func:`slurmrt.recovery.conclude.conclude`.
``docs/architecture.md`` walks one step, one stop, one save and one hang through them. Floor: above every part it
coordinates (``hang/``, ``recovery/``, ``checkpoint/``, ``stop/``, ``launch/``, ``record/``); only the public
package, the CLI, the simulator and the integrations stand above it.

- :mod:`.startup`: ``init()``; :mod:`.misconfigured`: a ``ConfigError`` nobody catches, said once per node (exit
  78). :mod:`.facade`: the ``Runtime``; :mod:`.view`: its read-only properties.
- :mod:`.controller`: the stop controller. :mod:`.session`: one run's checkpoints. :mod:`.report`: what a run says.
- :mod:`.hooks`: every process-global change, made and undone in one place; :mod:`.logs`: the default log handler.
- :mod:`.inprocess`: ``slurmrt.run_restartable``, which calls the training again in the same processes after a rank
  raised, putting the parts above back to their state before a first step.
"""

from __future__ import annotations

from .facade import Runtime
from .startup import init

__all__ = ["Runtime", "init"]
