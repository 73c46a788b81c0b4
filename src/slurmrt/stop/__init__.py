"""The parts of an agreed stop: every rank at the same step, for the right reason, with time left to save. Floor:
above ``launch/`` and ``record/``.

- :mod:`.controller`: the stop controller that coordinates them on the training thread (``should_stop``), handed
  its :mod:`.settings` section and its collaborators as protocols; :mod:`.state`: what it shares with the hang
  monitor (the step boundary, the activity, the agreement), below both.

- :mod:`.signals`: handlers that only record what arrived and when.
- :mod:`.killswitch`: the kill-switch file, and giving up on a job that hangs with the switch set.
- :mod:`.deadline`: the job's end time and the :class:`~.deadline.Budget` (step, save and margin arithmetic).
- :mod:`.watcher`: the background thread that polls the kill switch, the end time, the lease and the watchdog.
- :mod:`.straggler`: a rank consistently slower than the others, named with its node.
- :mod:`.decision`: the reasons, one rank's contribution to a round, the agreed decision.
- :mod:`.agreement`: the protocol that makes every rank take the same decision at the same step.
- :mod:`.pidfiles`: the node-local pid files through which ``slurmrt signal`` reaches training processes.
"""
