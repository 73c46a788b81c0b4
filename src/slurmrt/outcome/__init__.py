"""How a run ends.

- :mod:`.policy`: ``Outcome`` and its ``ExitCode``, the exit policy as one pure function, ``scontrol requeue``, the
  requeue-loop guard.
- :mod:`.exclusion`: the nodes excluded from the job (``ExcNodeList``) and their limits.
- :mod:`.conclude`: the end of a run on every rank: the policy's verdict, the requeue, and rank 0's outcome given to
  all.
"""
