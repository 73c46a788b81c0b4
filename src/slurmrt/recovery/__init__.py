"""Recovery: what the job does when a run ends or fails, decided in one place.

- :mod:`.facts`: what recovery needs to know, resolved once (``init()``, ``slurmrt run``).
- :mod:`.plan`: the one policy, ``plan(trigger, facts) -> Decision`` (pure).
- :mod:`.executor`: carries a decision out and records it (the only writer of the ``exit`` event).
- :mod:`.policy`: ``Outcome`` and its ``ExitCode``, the requeue-loop count, ``scontrol requeue``.
- :mod:`.conclude`: the end of a run on every rank. :mod:`.injob`: the request a step leaves for ``slurmrt run``.
- :mod:`.exclusion`: ``ExcNodeList`` and its limits.
- ``slurmrt run``: :mod:`.supervisor` (the loop of steps), :mod:`.steps` (the srun line, where a step goes),
  :mod:`.tasks` (srun's standard error, and the tasks it saw end), :mod:`.forward` (the warning signals, passed on),
  :mod:`.evidence` and :mod:`.probe` (each suspect node judged from outside), :mod:`.report` (the new step's block),
  :mod:`.answered` (what slurmrt in an ended step had answered).
- :mod:`.guard`: ``slurmrt guard``, the job ``slurmrt run`` arms on its own end, for a lost batch node.

Floor: above ``record/``, ``launch/``, ``stop/``, ``options`` and ``checkpoint/``; below ``hang/`` and ``runtime/``.
"""
