"""The health of the training itself, checked at an agreed step: a loss or a gradient norm that is not finite, or a
loss that spikes far above its recent values (:mod:`.window`, pure), agreed by every rank at the same step
(:mod:`.check`, one small all-reduce) and answered by a :class:`~slurmrt.TrainingHealthError` on every rank. Floor:
beside ``stop/``, above ``record/``.
"""
