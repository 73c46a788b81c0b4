"""What a job leaves behind for people and for its next runs. Floor: the lowest folder, beside ``launch/``; it
imports only slurmrt's private leaves.

- :mod:`.events`: the event log (names, writer, reader).
- :mod:`.timeline`: a job's life from its event log, as text and as a picture.
- :mod:`.experiment`: the experiment id kept next to the checkpoints.

What a run says in its log and event log is :mod:`slurmrt.runtime.report`'s. ``slurmrt.log`` (lines that never
interleave) and ``slurmrt.trackers`` (W&B, MLflow, TensorBoard across requeues) record too, but users import them by
name: they stay at the top of the package.
"""
