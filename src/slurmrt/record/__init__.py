"""What a job leaves behind for people and for its next runs. Floor: the lowest folder, beside ``launch/``; it
imports only slurmrt's private leaves.

- :mod:`.events`: the event log (names, writer, reader).
- :mod:`.runs`: the log read back as runs, and what earlier runs measured (step, save and phase times).
- :mod:`.timeline`: a job's life from its event log; :mod:`.chart` draws it, as text and as a picture.
- :mod:`.goodput`: where the job's wall time went (the ledger), from the same log.
- :mod:`.ledger`: the bad-node ledger, the nodes this user's jobs found bad.
- :mod:`.experiment`: the experiment id kept next to the checkpoints.

What a run says in its log and event log is :mod:`slurmrt.runtime.report`'s. ``slurmrt.log`` (lines that never
interleave) and ``slurmrt.trackers`` (W&B, MLflow, TensorBoard across requeues) record too, but users import them by
name: they stay at the top of the package.
"""
