"""``rt.check(step, loss=..., grad_norm=...)``: every rank judges its own values (:mod:`.window`), and the ranks agree
at this step whether any rank found its step unhealthy, with the one all-reduce a loop that logs a mean loss already
makes: the sum of the ranks' losses, where a rank whose step is unhealthy gives NaN. A finite sum: every rank is
healthy, and the check returns the mean loss (the loop logs it instead of all-reducing the loss a second time, so the
check costs its judgement, not a collective more). Otherwise a second all-reduce, on the fault's path only, says
what was found and by which ranks (the lowest and the highest). Then every rank raises the same
:class:`~slurmrt.TrainingHealthError`, before the optimizer step and before a save could keep the damage.

Each rank climbs the same ladder (:mod:`.rewind`): the step is re-run, or rewound to the newest certified checkpoint
with its batches skipped, or the run ends; the error carries the rung, and the recovery plan weighs it as for any
error (under ``slurmrt.run_restartable``, a restart in the process). Rank 0 keeps the record (:mod:`.record`) and
has the checkpoints after a rewind's target set aside (``on_rewind``), so that no later run resumes from them
(docs/guides/training-health.md).

A fault that one rank's values alone showed (a NaN on one rank, one copy of the replicas that differs) names that
rank's node. When the re-run passes the step, the fault was transient: the hardware, not the data. The node is then
handed to ``on_transient``, which leaves it out through the recovery plan (a new step or a requeue without it, and
the bad-node ledger), as for a node that failed its health check.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._comm import torch_distributed
from .._errors import ConfigError, TrainingHealthError
from ..record.events import Event, EventLog
from .record import HealthRecord, read_record, write_record
from .replicas import digest, flip_bit, odd_ranks, tensors_of
from .rewind import Rung, certify, climb
from .settings import HealthSection
from .window import LossWindow, Verdict

__all__ = ["FLIP_ENV", "REHEARSE_ENV", "SPIKE_ENV", "HealthCheck", "rehearsal"]

logger = logging.getLogger(__name__)

#: Set by ``slurmrt sim --nan TASK:STEP`` for that task: ``STEP`` (its loss of that step is NaN, once in the
#: process: a transient fault) or ``STEP:every`` (every time the process reaches that step: a reproducible one).
REHEARSE_ENV = "SLURMRT_SIM_NAN"
#: Set by ``slurmrt sim --flip TASK:STEP``: a bit of that task's replicas flips at that step, once (``STEP``).
FLIP_ENV = "SLURMRT_SIM_FLIP"
#: Set by ``slurmrt sim --spike TASK:STEP``: that task's loss of that step spikes, every time (a batch that causes it).
SPIKE_ENV = "SLURMRT_SIM_SPIKE"

#: The verdicts' codes in the agreement: the larger wins (a non-finite value says more than a spike).
_CODES = {"spike": 1, "nonfinite": 2}
_WHAT = {code: what for what, code in _CODES.items()}


def rehearsal(value: str | None, name: str = REHEARSE_ENV) -> tuple[int, bool] | None:
    """The step of a rehearsed fault and whether it comes back, from :data:`REHEARSE_ENV`'s value (or
    :data:`FLIP_ENV`'s, ``name``); None: none."""
    if not value:
        return None
    step, _, every = value.partition(":")
    if not step.isdigit() or every not in ("", "every"):
        logger.warning("%s=%r is not what slurmrt sim sets (STEP or STEP:every): nothing rehearsed", name, value)
        return None
    return int(step), every == "every"


class HealthCheck:
    def __init__(self, settings: HealthSection, events: EventLog, *, rank: int, world_size: int,
                 directory: Path | None = None, rehearse: tuple[int, bool] | None = None, flip: int | None = None,
                 spike: int | None = None,
                 on_certified: Callable[[int], None] | None = None,
                 on_rewind: Callable[[int], None] | None = None,
                 node_of: Callable[[int], str | None] | None = None,
                 on_transient: Callable[[int, list[str]], bool] | None = None) -> None:
        """``directory``: the checkpoints', where the record lives; ``rehearse``: (step, every time) of a NaN
        ``slurmrt sim`` puts in this rank's loss (:func:`rehearsal`), ``flip`` the step it flips a bit of this rank's
        replicas at, ``spike`` the step whose loss it makes spike; ``on_certified(step)``: a checkpoint was
        certified (retention keeps it); ``on_rewind(step)``: rank 0 sets aside the checkpoints after ``step``;
        ``node_of(rank)``: the node a rank runs on (None: unknown); ``on_transient(step, nodes)``: ``step`` passed on
        its re-run, so its fault was transient, and these nodes computed it wrong (every rank calls it; True: they
        are left out)."""
        self.settings, self.window = settings, LossWindow(settings)
        self._events, self._rank, self._world = events, rank, world_size
        self._directory, self._rehearse, self._flip, self._spike = directory, rehearse, flip, spike
        self._on_certified, self._on_rewind = on_certified, on_rewind
        self._node_of, self._on_transient = node_of, on_transient
        self._dist: Any = None
        self._tensor: Any = None
        #: The same on every rank: rank 0's file, heard at the first load, then changed alike by every rank.
        self.record = HealthRecord()
        self.heard = False  #: the record was heard from rank 0
        self._pending: set[int] = set()  #: checkpoints saved, not yet certified
        #: The rung of the last unhealthy step, until the load that follows it takes its rewind (:meth:`rewind_to`).
        self.rung: Rung | None = None
        self._hashing = False  #: replicas were given: a checkpoint is certified only where they agreed
        self._agreed: int | None = None  #: the last step the replicas' hashes agreed at, in this generation

    def check(self, step: int, *, loss: Any = None, grad_norm: Any = None, replicas: Any = None) -> float | None:
        """Judge this rank's values of ``step`` and agree with every rank (collective); raises
        :class:`TrainingHealthError` on every rank when any rank's step is unhealthy, else returns the mean of the
        losses the ranks gave (None: none gave one). ``replicas``: what every data-parallel rank holds the same copy
        of, compared every ``health_hash_every`` steps (collective too)."""
        if self._rehearse is not None and self._rehearse[0] == step:
            logger.warning("rank %d, step %d: slurmrt sim makes this loss NaN (a rehearsal)", self._rank, step)
            loss, self._rehearse = float("nan"), self._rehearse if self._rehearse[1] else None
        loss = _number(loss)
        if self._spike == step and loss is not None:
            logger.warning("rank %d, step %d: slurmrt sim makes this loss spike (a rehearsal)", self._rank, step)
            loss = abs(loss) * 100 + 1000.0
        mine = self.window.judge(loss, _number(grad_norm))
        code, first, alone, mean = self._agree(mine, loss)
        if code != 0:  # one rank's values alone were bad: its node is the suspect (the same values everywhere: none)
            self._unhealthy(step, _WHAT[code], first, mine, suspects=[first] if alone else [])
        if replicas is not None and self._world > 1:
            self._compare(step, replicas)
        self._healthy(step)
        return mean

    def _compare(self, step: int, replicas: Any) -> None:
        """Every ``health_hash_every`` steps (and at a generation's first check): the replicas' hashes, compared
        across the ranks; raises on every rank when a copy differs."""
        tensors = self._due(step, replicas)
        if tensors is None:
            return
        self._buffer()
        mine = digest(tensors).reshape(1)
        every = [mine.new_zeros(1) for _ in range(self._world)]
        self._dist.all_gather(every, mine)
        odd = odd_ranks(_values(every))
        if not odd:
            self._agreed = step
            return
        why = f"its replicas' hash differs from the other ranks' (rank(s) {', '.join(map(str, odd))} hold another copy)"
        if len(odd) * 2 >= self._world:  # two copies, or no majority: which one is wrong cannot be told
            why += f"; no majority of the {self._world} ranks agrees, so the rank named is only the first that differs"
        self._unhealthy(step, "replicas", odd[0], Verdict("replicas", why) if self._rank in odd else None,
                        agreed=self._agreed, suspects=odd if len(odd) * 2 < self._world else [])

    def _due(self, step: int, replicas: Any) -> list[Any] | None:
        """The replicas' tensors when they are compared at ``step``, else None; nothing is read on the other steps,
        not even the model's tensors (but for a rehearsed flip)."""
        self._hashing = True
        due = self._agreed is None or step % self.settings.health_hash_every == 0
        if not due and self._flip != step:
            return None
        tensors = tensors_of(replicas)
        if self._flip == step and flip_bit(tensors):
            logger.warning("rank %d, step %d: slurmrt sim flips a bit of this rank's replicas (a rehearsal)",
                           self._rank, step)
            self._flip = None
        return tensors if due else None

    def _unhealthy(self, step: int, what: str, first: int, mine: Verdict | None, *,
                   agreed: int | None = None, suspects: Sequence[int] = ()) -> None:
        """Every rank: say this rank's values, climb the ladder, and raise; rank 0 records it. ``suspects``: the
        ranks whose values alone were bad, whose nodes are left out if the re-run passes."""
        if mine is not None:  # a warning: the ladder answers it; a run it ends says so at the end (the plan's refusal)
            logger.warning("rank %d, step %d: %s", self._rank, step, mine.why)
        self.rung = rung = climb(self.record, step, max_rewinds=self.settings.health_max_rewinds, agreed=agreed)
        nodes: list[str] = []
        if rung.action == "rerun":
            nodes = self.record.suspects[step] = self._nodes(suspects)
        else:  # it came back: the data or the model, not the nodes
            self.record.suspects.pop(step, None)
        if self._rank == 0:
            self._events.emit(Event.TRAINING_HEALTH, step=step, what=what, first_rank=first,
                              why=mine.why if mine is not None and first == self._rank else None,
                              action=rung.action, certified=rung.certified, rung=rung.why, suspects=nodes)
            write_record(self._directory, self.record)
            if rung.below is not None and self._on_rewind is not None:
                self._on_rewind(rung.below)  # before any restart: no later run resumes from what follows it
        raise TrainingHealthError(f"step {step}: rank {first}'s training is unhealthy ({what}; its log line says the "
                                  f"values): stopped before the optimizer step and any save; {rung.why}",
                                  step=step, rank=first, what=what, action=rung.action,
                                  refused=rung.why if rung.action == "end" else None)

    def _nodes(self, ranks: Sequence[int]) -> list[str]:
        """The nodes of ``ranks`` that are known, the same on every rank (collective when ``ranks`` is not empty: each
        rank's census answer, united; none when no rank's census can say: the fault is answered all the same, with
        no node named)."""
        mine = self._known_nodes(ranks) if ranks else []
        if not ranks or self._world == 1 or self._dist is None:
            return mine
        every: list[Any] = [None] * self._world
        self._dist.all_gather_object(every, mine)  # a rank whose store did not answer still leaves the node out
        return sorted({n for nodes in every for n in nodes or ()})

    def _known_nodes(self, ranks: Sequence[int]) -> list[str]:
        if self._node_of is None:
            return []
        try:
            return sorted({n for n in map(self._node_of, ranks) if n})
        except Exception as err:  # noqa: BLE001 - a store that does not answer names no node; it stops nothing
            logger.warning("the nodes of rank(s) %s could not be read (%s): no node is named for this fault",
                           ", ".join(map(str, ranks)), err)
            return []

    def _transient(self, step: int) -> None:
        """``step`` passed on its re-run: its fault was transient. Its suspects' nodes go to ``on_transient``."""
        nodes = self.record.suspects.pop(step, None)
        if nodes is None:
            return
        where = f"the hardware of {', '.join(nodes)} is suspect" if nodes else \
            "every rank's values were bad alike, so no node is named"
        if self._rank == 0:  # every rank knows it; one says it, before what is done about it
            logger.warning("step %d passed on its re-run: its fault was transient; %s", step, where)
        left_out = bool(nodes and self._on_transient is not None and self._on_transient(step, nodes))
        if self._rank == 0:
            self._events.emit(Event.TRANSIENT_FAULT, step=step, nodes=nodes, left_out=left_out)
            write_record(self._directory, self.record)

    # -- the record, the certificates, the rewinds -------------------------------------------------------------------
    def saved(self, step: int) -> None:
        """Checkpoint ``step`` was saved to the shared tier: certified once healthy long enough after it."""
        if self.record.certified is None or step > self.record.certified:
            self._pending.add(step)

    def skip(self, step: int) -> bool:
        """True when the loop skips ``step``'s batch: a rewind went back before it, past a reproducible fault."""
        return bool(self.record.skips) and self.record.skipped(step)

    def rewind_to(self) -> int | None:
        """The certified step the next load may not go past (the last fault's rewind or end), once; None: any."""
        rung, self.rung = self.rung, None
        return rung.below if rung is not None else None

    def loaded(self, step: int | None, from_lead: Callable[[Callable[[], str]], str]) -> None:
        """After a load, collective: the record heard from rank 0 at the first (``from_lead(read)``: rank 0's
        ``read()`` on every rank); then ``step``, resumed from (None: a fresh start), is certified in its turn."""
        if not self.heard:
            self.record = HealthRecord.from_json(from_lead(lambda: read_record(self._directory).to_json()))
            self.heard = True
            if self.record.certified is not None and self._on_certified is not None:
                self._on_certified(self.record.certified)
        self._agreed = None  # the replicas as loaded: compared at the first check
        self._pending = {step} if step is not None and (self.record.certified is None or
                                                        step > self.record.certified) else set()

    def _healthy(self, step: int) -> None:
        if self.record.suspects:
            self._transient(step)
        agreed = (-1 if self._agreed is None else self._agreed) if self._hashing else None
        newly = certify(self.record, self._pending, step, after=self.settings.health_certify_after, agreed=agreed)
        if newly is None:
            return
        if self._on_certified is not None:
            self._on_certified(newly)
        if self._rank == 0:
            self._events.emit(Event.CERTIFIED, step=newly, at=step)
            write_record(self._directory, self.record)

    def _agree(self, mine: Verdict | None, loss: float | None) -> tuple[int, int, bool, float | None]:
        """The largest verdict code of any rank (0: every rank healthy), the lowest rank with a verdict, whether it
        was the only one, and the mean of the ranks' losses (a rank that gave none counts 0; None: this rank gave
        none). The sum of the losses, NaN from an unhealthy rank; only a sum that is not finite asks who."""
        buffer = self._buffer()
        if buffer is None:
            return (_CODES[mine.what], self._rank, True, None) if mine is not None else (0, -1, False, loss)
        buffer.fill_(float("nan") if mine is not None else loss or 0.0)
        self._dist.all_reduce(buffer)
        total = buffer.item()
        if math.isfinite(total):
            return 0, -1, False, total / self._world if loss is not None else None
        code, first, last = self._who(mine)
        if code == 0:  # every rank healthy, and their losses' sum overflowed
            return 0, -1, False, total / self._world if loss is not None else None
        return code, first, first == last, None

    def _who(self, mine: Verdict | None) -> tuple[int, int, int]:
        """On a fault's path (every rank calls it): the largest verdict code, and the lowest and the highest rank with
        a verdict, in one MAX of three integers."""
        import torch

        code = _CODES[mine.what] if mine is not None else 0
        lowest = self._world - self._rank if mine is not None else 0  # MAX of (world - rank): the lowest rank
        highest = self._rank + 1 if mine is not None else 0
        who = torch.tensor([code, lowest, highest], dtype=torch.int64, device=self._tensor.device)
        self._dist.all_reduce(who, op=self._dist.ReduceOp.MAX)
        code, lowest, highest = who.tolist()
        return code, self._world - lowest, highest - 1

    def _buffer(self) -> Any:
        """The number the ranks reduce, made once on the training group's device (the GPU under NCCL); None
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
            self._dist, self._tensor = dist, torch.zeros(1, dtype=torch.float64, device=device)
        return self._tensor


def _values(gathered: list[Any]) -> list[int]:
    """The ranks' hashes, read back in one transfer."""
    import torch

    return [int(v) for v in torch.cat(gathered).tolist()]


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
