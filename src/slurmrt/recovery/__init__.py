"""Recovery: what the job does when a run ends or fails, decided in one place.

- :mod:`.facts`: what recovery needs to know, resolved once (``init()``, ``slurmrt run``).
- :mod:`.plan`: the one policy, ``plan(trigger, facts) -> Decision`` (pure).
- :mod:`.executor`: carries a decision out and records it (the only writer of the ``exit`` event).
- :mod:`.policy`: ``Outcome`` and its ``ExitCode``, the requeue-loop count, ``scontrol requeue``.
- :mod:`.conclude`: the end of a run on every rank. :mod:`.injob`: the request a step leaves for ``slurmrt run``.
- :mod:`.exclusion`: ``ExcNodeList`` and its limits. :mod:`.supervisor`: ``slurmrt run``.

Floor: above ``record/``, ``launch/``, ``stop/``, ``options`` and ``checkpoint/``; below ``hang/`` and ``runtime/``.
"""
