"""When to save, from measurements: ``rt.should_save(step)`` (issue 41).

A save costs the time it blocks training (its stall, ``C``). A failure costs the work since the newest checkpoint
it can resume from. Over a long run the interval between saves that loses the least is Young's (1974)
``sqrt(2 C M)``, for a mean time between failures ``M``; Daly (2006) refined it for saves that are not small next to
``M``, and his form is the one used here::

    T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C     (C < 2M; else T = M)

``C`` is measured on every save: rank 0's stall, the mean of the tier's last three (before one is measured in this
run, the earlier runs' saves from the event log). ``M`` is learned from the experiment's own history, the runs and
in-job attempts before this one: the time they ran over the failures that cut them (a hang, a lost node or rank, a
killed run), plus a prior of one failure in ``mtbf_node_h`` node-hours shared by the job's nodes (so a job of twice
the nodes fails twice as often). The current run's own time counts too, as it grows: a run that lasts is evidence.
Once the job has seen ``history.OWN_RATE_FROM`` failure of its own, its own rate (time run over failures) wins
where it is shorter: a prior of thousands of node-hours would otherwise outweigh a bad batch of nodes failing every
few minutes, and the two errors do not cost the same (saving too often costs a stall per save; too rarely, the work
since the last one). One failure is enough: a job that failed once in its first minutes saves often for a while,
and less as it lasts (its own rate counts the current run's time), where waiting for a second failure lost all the
work since the first save twice.
A preemption or a time limit is not a failure: a stop saves first and loses nothing.

With a local tier (``local_checkpoint_dir``) there are two intervals, chosen together. A save of either tier resets
the work at risk from the failures the local tier survives (a node lost while its partner lives: an in-job restart
resumes from it); only a shared save resets it for the rest, a share ``p`` of the failures. A shared save takes a
local one's place, so per second of training the saves and the failures cost::

    C_l / T_l + (C_s - C_l) / T_s + ((1 - p) T_l + p T_s) / 2M

least at Daly's local interval for ``C_l`` and ``M / (1 - p)``, and Daly's shared interval for the difference
``C_s - C_l`` and ``M / p``. Where a shared save stalls no more than a local one (a background save against a
blocking one), or the local interval comes out no shorter than the shared, local saves buy nothing: shared saves
alone, at Daly's interval for ``C_s`` and ``M``. ``p`` is learned too, from a prior of one in two: a failure counts
as served when the local tier held a whole checkpoint at the resume after it, whichever tier was newer.

Until the job has failed once, one tier's interval is also at most Daly's for one failure in the time the
experiment has trained so far (:func:`insured`), its saves' share of the training time kept between
``MOST_OVERHEAD`` (10 %) and ``LOCAL_OVERHEAD`` (1 %): the prior is a guess until the first failure, and a run that
has lasted ``t`` without one is evidence that failures come about as rarely as ``t``, not much rarer. A fresh
allocation's bad node, a broken driver or a data error shows itself in a job's first minutes, and a first failure
with no recent save loses all the work since the start (under a 1 % share alone, every minute of it for a save
that stalls 0.6 s); CheckFreq (FAST '21) bounds its saves' overhead the same way. For a 0.12 s save the insurance
saves every 1.2 s of training in its first seconds, every 3.4 s at 50 s, and every 12 s (1 %) from about 10
minutes. The tier is the one that insures for less (:func:`insurer`): each at its insured interval, the one whose
stall and half an interval of lost work cost less per second of training. A shared save's interval is bounded by
its whole time, the write behind the training included: its share of the filesystem's time stays within the same
10 % to 1 %, where its stall alone (a background save's copy to host memory) would let it write all the time. So where
a background shared save writes about as fast as a blocking local save and stalls less, the insurance goes through
the shared tier; where its write is much slower (a busy parallel filesystem), through the local one; without a local
tier, through the shared one. From the first failure the job's own rate speaks, and the insurance ends: where the
prior was right, it would cost 1 % for good.

Every rank must get the same answer at the same step, without a collective per step. The answer is decided at
*check steps*: every rank calls ``should_save`` at every step; at a check step they take part in one broadcast of
rank 0's decision, which carries the next check step, computed from rank 0's clock and measured step time. Between
two checks the call is one comparison. Typically one check per save.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .. import _clock
from .._comm import Comm
from .history import History

__all__ = ["LOCAL_OVERHEAD", "MOST_OVERHEAD", "STALLS", "Cadence", "History", "Intervals", "daly", "expected_stall",
           "insured", "insurer", "intervals", "tiers"]

logger = logging.getLogger(__name__)

#: With no save measured yet (a fresh experiment), the first check after this many steps saves to the shared
#: tier, and the next to the local tier if any: their stalls are then known, and a checkpoint exists early (a
#: broken save shows in minutes, not hours).
WARMUP_STEPS = 3
#: A tier's stall is the mean of its last this many saves.
STALLS = 3
#: Until the job's first failure, the insuring tier's saves take at least this share of the training time (a
#: shared save's whole write counted) when the prior alone would save less often (:func:`insured`) ...
LOCAL_OVERHEAD = 0.01
#: ... and no more than this share, however short the time trained so far.
MOST_OVERHEAD = 0.10


def daly(cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum compute time between two saves, for a save stall ``cost_s`` and a mean time between failures
    ``mtbf_s`` (both > 0). Young's ``sqrt(2 C M)`` to first order."""
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


@dataclass(frozen=True)
class Intervals:
    """Seconds of training between two shared saves, and between two local ones (None: no local saves)."""

    shared_s: float
    local_s: float | None = None


def intervals(history: History, *, shared_cost_s: float, local_cost_s: float | None, node_h: float, nodes: int,
              shared_write_s: float | None = None) -> Intervals:
    """The two intervals for the job's history (see the module's docstring): :func:`tiers` for its failure rate and
    the share of its failures the local tier did not serve; before its first failure, insured through the tier that
    insures for less (:func:`insurer`). ``shared_write_s``: a shared save's whole time, its write behind the
    training included (the shared tier's insured interval bounds the filesystem's share, not only the stall's)."""
    mtbf, share = history.mtbf_s(node_h=node_h, nodes=nodes), history.shared_share()
    if history.failures:
        return tiers(shared_cost_s, local_cost_s, mtbf_s=mtbf, share=share)
    trained, written = history.exposure_s, max(shared_cost_s, shared_write_s or 0.0)
    if local_cost_s is not None and insurer(trained, shared_cost_s=shared_cost_s, shared_write_s=written,
                                            local_cost_s=local_cost_s) == "local":
        return tiers(shared_cost_s, local_cost_s, mtbf_s=mtbf, share=share, insured_s=insured(local_cost_s, trained))
    plan = tiers(shared_cost_s, local_cost_s, mtbf_s=mtbf, share=share)
    return replace(plan, shared_s=min(plan.shared_s, insured(written, trained)))


def insurer(trained_s: float, *, shared_cost_s: float, shared_write_s: float, local_cost_s: float | None) -> str:
    """The tier whose saves insure a job that has not failed yet for less: each at its :func:`insured` interval
    (the shared tier's for its whole write), the one whose stall and half-interval of work lost cost less per
    second of training, for one failure in the ``trained_s`` seconds trained so far."""
    trained = max(trained_s, 1e-3)

    def cost(stall: float, bound: float) -> float:
        every = insured(bound, trained)
        return max(stall, 1e-3) / every + every / (2 * trained)

    if local_cost_s is None:
        return "shared"
    return "local" if cost(local_cost_s, local_cost_s) <= cost(shared_cost_s, shared_write_s) else "shared"


def insured(cost_s: float, trained_s: float) -> float:
    """The interval before the job's first failure at most, for a tier's save that costs ``cost_s``: Daly's for one
    failure in the ``trained_s`` seconds the experiment has run, the save's share of the training time between
    ``LOCAL_OVERHEAD`` and ``MOST_OVERHEAD`` (module docstring)."""
    cost = max(cost_s, 1e-3)
    return min(max(daly(cost, max(trained_s, 1e-3)), cost / MOST_OVERHEAD), cost / LOCAL_OVERHEAD)


def tiers(shared_cost_s: float, local_cost_s: float | None, *, mtbf_s: float, share: float,
          insured_s: float = math.inf) -> Intervals:
    """The two intervals chosen together, for saves that stall ``shared_cost_s`` and ``local_cost_s`` (None: no
    local tier) and failures every ``mtbf_s``, a ``share`` of which the local tier does not serve (module docstring);
    ``insured_s``: the local interval at most this, kept where shared saves alone would do."""
    shared_c = max(shared_cost_s, 1e-3)
    alone = daly(shared_c, mtbf_s)  # shared saves alone: they serve every failure
    if local_cost_s is None:
        return Intervals(alone)
    local_c = max(local_cost_s, 1e-3)
    local = min(daly(local_c, mtbf_s / (1 - share)) if share < 1 else math.inf, insured_s)
    if shared_c > local_c and share > 0:  # a shared save in place of a local one costs the difference
        shared = daly(shared_c - local_c, mtbf_s / share)
        if local < shared:
            return Intervals(shared, local)
    return Intervals(alone, local) if insured_s < math.inf and local < alone else Intervals(alone)


class Cadence:
    """The answers of ``rt.should_save(step)`` on one rank (see the module's docstring).

    ``comm`` opens slurmrt's work group (for the broadcast at check steps); ``events`` is the event log (rank 0 reads
    the history from it once); ``stalls`` gives each tier's last stalls in the earlier runs' log; ``step_s`` the
    measured step time; ``local``: whether the job has a local tier; ``join`` waits for a background save in flight:
    it holds the work group until it is joined (:mod:`slurmrt._comm`), so the check's broadcast comes after it;
    ``writes`` gives this run's last shared saves' whole times (their writes behind the training included);
    ``written``: the earlier runs' figure, until this run has one."""

    def __init__(self, *, rank: int, comm: Callable[[], Comm], events: Path | None, current: tuple[int, int],
                 nodes: int, node_h: float, local: bool, step_s: Callable[[], float | None],
                 stalls: Mapping[str, list[float]] | None = None,
                 join: Callable[[], None] = lambda: None, writes: Callable[[], list[float]] = list,
                 written: float | None = None) -> None:
        self._rank, self._comm, self._events, self._current, self._join = rank, comm, events, current, join
        self._writes, self._written = writes, written
        self._nodes, self._node_h, self._local, self._step_s = nodes, node_h, local, step_s
        self._check: int | None = None  # the next check step: the same on every rank
        self._last: int | None = None  # the last step asked about, counted on (:meth:`_counted`)
        self._base = 0  # what the steps of the epochs before this one add
        self._history: History | None = None
        #: each tier's last STALLS stalls (the earlier runs' figure until this run measures): :meth:`_stall`
        self._stalls: dict[str, list[float]] = {tier: list((stalls or {}).get(tier, []))[-STALLS:]
                                                for tier in ("shared", "local")}
        self._since: dict[str, float] = {}  # rank 0: when each tier's newest save of this run ended
        self._started: float | None = None  # rank 0: the first call's time (this run's time counts into the history)
        self._faults = 0  # the faults this run lived through (in-process restarts)
        self.plan: Intervals | None = None  #: rank 0's intervals at the last check

    def due(self, step: int) -> str | None:
        """The tier to save ``step`` to ("shared", "local"), or None. Collective at check steps. A step lower than
        the last one (a loop whose step starts at 0 each epoch) counts on from the last: every rank sees the same
        steps, so every rank counts the same."""
        step = self._counted(step)
        if self._check is not None and step < self._check:
            return None
        self._join()  # a background save's commit runs on the work group: two threads there would cross collectives
        decided = self._decide(step) if self._rank == 0 else None
        answer, self._check = self._comm().broadcast(decided)
        return answer

    def _counted(self, step: int) -> int:
        """``step`` on a count that never goes back."""
        if self._last is not None and step + self._base <= self._last:
            if self._base == 0 and self._rank == 0:
                logger.info("rt.should_save: the step went back from %d to %d (a step counted per epoch?): counting "
                            "on from %d", self._last, step, self._last)
            self._base = self._last + 1 - step
        self._last = step + self._base
        return self._last

    def saved(self, tier: str, stall_s: float, *, ok: bool = True) -> None:
        """A save of ``tier`` returned after blocking training ``stall_s`` seconds (rank 0's count); ``ok``: it was
        made. A local save that failed (no local directory, a full tmpfs: said in the log) leaves the local tier
        out of the answers for the rest of the run: the shared tier alone."""
        if not ok:
            if tier == "local" and self._local:
                self._local = False
                logger.warning("rt.should_save: the local tier failed to save; answering the shared tier alone")
            return
        self._stalls[tier] = [*self._stalls[tier][-(STALLS - 1):], stall_s]
        self._since[tier] = _clock.mono()

    def restart(self) -> None:
        """An in-process restart: every rank goes on from the same checkpoint, but each left the failed generation at
        a step of its own (the one that raised, the others in the collective after it). The step count and the check
        step start again, so that every rank asks at the same step: the next call is a check on every rank. The fault
        counts as a failure of this run, served by the tier the restart reloaded (the local one, if any)."""
        self._check = self._last = None
        self._base = 0
        self._faults += 1

    def _decide(self, step: int) -> tuple[str | None, int]:
        now = _clock.mono()
        if self._check is None:  # the first call (or the first after a restart): the clock starts, nothing is due
            return self._first(step, now)
        unmeasured = self._unmeasured()
        if unmeasured is not None:  # save once to each tier, to measure it
            return unmeasured, step + WARMUP_STEPS
        self.plan = intervals(self._failures(now), shared_cost_s=self._stall("shared") or 0.0,
                              local_cost_s=self._stall("local") if self._local else None, node_h=self._node_h,
                              nodes=self._nodes, shared_write_s=expected_stall(self._writes()) or self._written)
        return self._due(self.plan, step, now)

    def _due(self, plan: Intervals, step: int, now: float) -> tuple[str | None, int]:
        """The tier due now (None: none), and the step of the next check: when the first tier falls due."""
        left = self._left(plan, now)
        step_s = self._step_s() or 0.0
        due = next((tier for tier, s in left.items() if s <= step_s / 2), None)
        if due is not None:  # it saves now: that tier's interval starts again (a shared save is newest for both)
            left.update({t: getattr(plan, f"{t}_s") for t in left if t == due or due == "shared"})
        return due, step + _steps(min(left.values()), step_s)

    def _first(self, step: int, now: float) -> tuple[None, int]:
        self._since.setdefault("shared", now)
        if self._started is None:  # this run's time counts from its first call, across in-process restarts
            self._started = now
        return None, step + WARMUP_STEPS

    def _failures(self, now: float) -> History:
        """The experiment's failures: the earlier runs', this run's time so far, and the faults it lived through."""
        lasted = now - self._started if self._started is not None else 0.0
        return self._known_history().lasting(lasted).failing(self._faults, local=self._local)

    def _unmeasured(self) -> str | None:
        """The tier whose stall is not known yet, shared first."""
        if not self._stalls["shared"]:
            return "shared"
        return "local" if self._local and not self._stalls["local"] else None

    def _stall(self, tier: str) -> float | None:
        return expected_stall(self._stalls[tier])

    def _left(self, plan: Intervals, now: float) -> dict[str, float]:
        """Seconds of training until each tier's save is due. Local saves count from the newest save of either
        tier: a failure the local tier serves loses the work since the newest checkpoint it can read."""
        left = {"shared": plan.shared_s - (now - self._since["shared"])}
        if plan.local_s is not None:
            left["local"] = plan.local_s - (now - max(self._since.values()))
        return left

    def _known_history(self) -> History:
        if self._history is None:
            from ..record.events import read_events

            try:
                self._history = History.of(read_events(self._events, own=True), current=self._current) \
                    if self._events is not None else History()
            except OSError as err:
                logger.warning("cannot read the event log for the failure history (%s): the prior alone is used", err)
                self._history = History()
        return self._history


def expected_stall(stalls: list[float]) -> float | None:
    """A tier's stall to expect, Daly's ``C``: the mean of its last ``STALLS`` saves (one slow save is not it); None
    when none was measured. ``rt.should_save`` and ``slurmrt status``'s advice both take it from here, and a shared
    save's whole time (its write included, the insurance's bound) the same way."""
    last = stalls[-STALLS:]
    return sum(last) / len(last) if last else None


def _steps(seconds: float, step_s: float) -> int:
    """The steps to the next check: ``seconds`` of training, at least one step."""
    return max(1, int(seconds / step_s) if step_s > 0 else 1)
