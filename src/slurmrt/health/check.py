"""``rt.check(step, loss=..., grad_norm=...)``: every rank judges its own values (:mod:`.window`), and the ranks agree
at this step, with one all-reduce of two integers on the training's own process group, whether any rank found its
step unhealthy, and which rank first. Then every rank raises the same :class:`~slurmrt.TrainingHealthError`, before
the optimizer step and before a save could keep the damage.

What follows is the recovery plan's, as for any error: under ``slurmrt.run_restartable`` the ranks are restarted in
the process from the newest checkpoint (the local tier first), a rewind; if the same error comes back at the same
step it is reproducible (the data or the model), and the run ends (docs/guides/training-health.md).
"""

from __future__ import annotations

import logging
from typing import Any

from .._comm import torch_distributed
from .._errors import ConfigError, TrainingHealthError
from ..record.events import Event, EventLog
from .settings import HealthSection
from .window import LossWindow, Verdict

__all__ = ["REHEARSE_ENV", "HealthCheck", "rehearsal"]

logger = logging.getLogger(__name__)

#: Set by ``slurmrt sim --nan TASK:STEP`` for that task: ``STEP`` (its loss of that step is NaN, once in the
#: process: a transient fault) or ``STEP:every`` (every time the process reaches that step: a reproducible one).
REHEARSE_ENV = "SLURMRT_SIM_NAN"

#: The verdicts' codes in the agreement: the larger wins (a non-finite value says more than a spike).
_CODES = {"spike": 1, "nonfinite": 2}
_WHAT = {code: what for what, code in _CODES.items()}


def rehearsal(value: str | None) -> tuple[int, bool] | None:
    """The step of a rehearsed NaN and whether it comes back, from :data:`REHEARSE_ENV`'s value; None: none."""
    if not value:
        return None
    step, _, every = value.partition(":")
    if not step.isdigit() or every not in ("", "every"):
        logger.warning("%s=%r is not what slurmrt sim sets (STEP or STEP:every): no NaN rehearsed", REHEARSE_ENV,
                       value)
        return None
    return int(step), every == "every"


class HealthCheck:
    def __init__(self, settings: HealthSection, events: EventLog, *, rank: int, world_size: int,
                 rehearse: tuple[int, bool] | None = None) -> None:
        """``rehearse``: (step, every time) of a NaN ``slurmrt sim`` puts in this rank's loss (:func:`rehearsal`)."""
        self.window = LossWindow(settings)
        self._events, self._rank, self._world = events, rank, world_size
        self._rehearse = rehearse
        self._dist: Any = None
        self._tensor: Any = None

    def check(self, step: int, *, loss: Any = None, grad_norm: Any = None) -> None:
        """Judge this rank's values of ``step`` and agree with every rank (collective); raises
        :class:`TrainingHealthError` on every rank when any rank's step is unhealthy."""
        if self._rehearse is not None and self._rehearse[0] == step:
            logger.warning("rank %d, step %d: slurmrt sim makes this loss NaN (a rehearsal)", self._rank, step)
            loss, self._rehearse = float("nan"), self._rehearse if self._rehearse[1] else None
        mine = self.window.judge(_number(loss), _number(grad_norm))
        code, first = self._agree(mine)
        if code == 0:
            return
        what = _WHAT[code]
        if mine is not None:
            logger.error("rank %d, step %d: %s", self._rank, step, mine.why)
        if self._rank == 0:
            self._events.emit(Event.TRAINING_HEALTH, step=step, what=what, first_rank=first,
                              why=mine.why if mine is not None and first == self._rank else None)
        raise TrainingHealthError(f"step {step}: rank {first}'s training is unhealthy ({what}; its log line says the "
                                  "values): stopped before the optimizer step and any save",
                                  step=step, rank=first, what=what)

    def _agree(self, mine: Verdict | None) -> tuple[int, int]:
        """The largest verdict code of any rank (0: every rank healthy) and the lowest rank with a verdict."""
        code = _CODES[mine.what] if mine is not None else 0
        flagged = self._world - self._rank if mine is not None else 0  # MAX of (world - rank): the lowest rank
        buffer = self._buffer()
        if buffer is not None:
            buffer[0], buffer[1] = code, flagged
            self._dist.all_reduce(buffer, op=self._dist.ReduceOp.MAX)
            code, flagged = buffer.tolist()
        return code, self._world - flagged if code else -1

    def _buffer(self) -> Any:
        """The two integers the ranks reduce, made once on the training group's device (the GPU under NCCL); None
        for one process. Several processes without ``init_process_group`` would each decide alone, and a rank that
        raised would leave the others waiting in their next collective: refused."""
        if self._tensor is None and self._world > 1:
            dist = torch_distributed()
            if dist is None or not dist.is_initialized():
                raise ConfigError(f"rt.check() agrees across the launch's {self._world} processes through "
                                  "torch.distributed, which is not initialized: call init_process_group() first",
                                  world_size=self._world)
            import torch

            nccl = dist.get_backend() == "nccl"
            device = f"cuda:{torch.cuda.current_device()}" if nccl else "cpu"
            self._dist, self._tensor = dist, torch.zeros(2, dtype=torch.int64, device=device)
        return self._tensor


def _number(value: Any) -> float | None:
    """A loss or a norm as a float (a one-element tensor too: ``float`` reads it), or None; anything else is a
    clear error, not one from deep inside torch."""
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)):
        raise ConfigError(f"rt.check(): loss and grad_norm are numbers or one-element tensors, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as err:
        shown = repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"
        raise ConfigError(f"rt.check(): loss and grad_norm are numbers or one-element tensors, not {shown} "
                          f"({err})") from None
