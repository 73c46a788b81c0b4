"""What an unhealthy step leads to, and when a checkpoint is certified: pure, the same on every rank (the checks are
agreed), over the :class:`~.record.HealthRecord` every rank holds.

The ladder, as the rerun engines climb it (Megatron-core's rerun state machine re-runs the step; the OPT and BLOOM
logbooks rolled back and skipped the data):

1. A step found unhealthy for the first time is **re-run**: the training restarts from the newest checkpoint before
   it. A fault that does not come back was transient.
2. The same step unhealthy again is **reproducible** (the data or the model): the training **rewinds** to the newest
   certified checkpoint, and the loop skips the batches of the steps from it to the faulty one (``rt.skip``).
3. After ``health_max_rewinds`` rewinds to the same certified checkpoint, or with none certified, the run **ends**,
   naming the checkpoint to start from.

A checkpoint is certified once the training stayed healthy ``health_certify_after`` steps after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .record import HealthRecord

__all__ = ["Rung", "certify", "climb"]


@dataclass(frozen=True)
class Rung:
    """What an unhealthy step leads to: ``action`` is ``"rerun"``, ``"rewind"`` or ``"end"``."""

    action: str
    why: str
    #: rewind, end: the certified step the training goes back to (None: none is certified)
    certified: int | None = None
    #: The step the next load may not go past (None: any before the faulty step): the certified one, or for a
    #: re-run after the replicas disagreed, the last step they agreed at (a checkpoint after it may hold the damage).
    below: int | None = None


def climb(record: HealthRecord, step: int, *, max_rewinds: int, agreed: int | None = None) -> Rung:
    """The rung for an unhealthy ``step``; counts it in ``record``, and a rewind's skip and count too. ``agreed``: the
    replicas disagreed at ``step``, and this is the last step they agreed at (None: not a disagreement)."""
    times = record.faults.get(step, 0) + 1
    record.faults[step] = times
    if times == 1:
        since = "before it" if agreed is None else f"at or before step {agreed}, where the replicas last agreed"
        return Rung("rerun", f"step {step} is re-run from the newest checkpoint {since} (at once under "
                             "run_restartable, else when the run starts again): a fault that does not come back was "
                             "transient", below=agreed)
    target = record.certified
    if target is None or target >= step:
        return Rung("end", f"step {step} was unhealthy {times} times (reproducible: the data or the model) and no "
                           "checkpoint before it is certified (healthy health_certify_after steps after it): nothing "
                           "to rewind to; start again from the newest checkpoint with other data or settings")
    done = record.rewinds.get(target, 0)
    if done >= max_rewinds:
        return Rung("end", f"step {step} was unhealthy {times} times (reproducible: the data or the model) after "
                           f"{done} rewind(s) to certified step {target} (health_max_rewinds={max_rewinds}): start "
                           f"again from checkpoint step_{target:09d} with other data or settings", target, target)
    record.rewinds[target] = done + 1
    record.skips.append((target + 1, step))
    return Rung("rewind", f"step {step} was unhealthy again (reproducible: the data or the model): rewound to "
                          f"certified step {target}, the batches of steps {target + 1}-{step} skipped", target, target)


def certify(record: HealthRecord, pending: set[int], step: int, *, after: int, agreed: int | None = None) -> int | None:
    """The newly certified checkpoint once ``step`` was healthy: the newest of ``pending`` (saved, not yet certified)
    at least ``after`` steps behind it, and with replica hashes at or before ``agreed``, the last step the replicas
    agreed at (a copy that differs stays different); those leave ``pending``. None: none newly."""
    done = [saved for saved in pending if step - saved >= after and (agreed is None or saved <= agreed)]
    if not done:
        return None
    pending.difference_update(done)
    newest = max(done)
    if record.certified is not None and newest <= record.certified:
        return None
    record.certified = newest
    return newest
