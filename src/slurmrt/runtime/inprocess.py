"""The in-process restart (``slurmrt.run_restartable(rt, train)``): when the training function raises on some rank
and every process lives through it, the ranks rebuild the default process group and call the function again,
without a new step or a requeue.

One generation is one call of ``train(generation)`` on a default group made here, on a prefix of its own of one
TCP store that outlives the groups (rank 0 holds it at ``MASTER_ADDR:MASTER_PORT`` for the whole process; under
torchrun, its agent's store there). When
``train`` raises an ``Exception`` on a rank:

1. the rank posts its fault under the generation's key (the first post wins: the root cause, not the peers' "connection
   closed" that follows), then aborts the default group (every group made from it goes with it) and slurmrt's two
   trees. A peer in a collective with it, or in an agreement round, fails at once; its own ``Exception`` takes it
   here too, and so on: every rank that trains with the others reaches this point within one collective.
2. Each rank asks the recovery plan about the first fault (:attr:`~slurmrt.recovery.plan.Trigger.RAISED`), the same
   on every rank: restart, unless a stop was already agreed, the fault is a misconfiguration, the same error (type
   and step) ended an earlier generation (a software error that repeats), or ``max_in_process_restarts`` generations
   were restarted. A rank that refuses says so in the store, and the others refuse with it.
3. Each rank puts slurmrt's per-run parts back to their state before the first step (the agreement, the groups, the
   checkpoint session, the census), arrives at the generation's rejoin count, and waits for every rank. A rank whose
   process died never arrives: after ``rejoin_timeout_s`` the others raise their own exception, and the process ends
   as it would have without the wrapper (under ``slurmrt run``, a new step; else the requeue).

What is not recovered in the process: a process that died (SIGKILL, a segfault, the OOM killer: the new step's or the
requeue's), a hang (the watchdog's: the stacks, then the exit), a node that failed its health check, and a CUDA error
that leaves the device unusable (a sticky error: the process must end). State that lives outside ``train`` (a model
built before it, a data loader's worker processes, a CUDA graph) is the user's to rebuild inside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _figures as figures
from .._comm import torch_distributed
from .._errors import ConfigError, TrainingHealthError
from .._text import shorten
from ..launch.topology import LaunchMode
from ..recovery import injob
from ..recovery.facts import InProcessFacts, Raised
from ..recovery.plan import Action, Decision
from .peerabort import FAULT, PeerAbort
from .release import release

if TYPE_CHECKING:
    from .view import TopologyView as Runtime  # the facade's base: the facade itself would make an import cycle

__all__ = ["Fault", "InProcess", "run_restartable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
PREFIX = "slurmrt/inprocess"
GO = "go"  #: the verdict that every rank is back


@dataclass(frozen=True)
class Fault:
    """The first fault of a generation, as the rank that raised it posted it."""

    rank: int
    error: str  #: the exception's type and the start of its message
    kind: str  #: the exception's type: with the step, what makes an error the same as an earlier one
    #: the last step that rank reported in this generation; before its first, the step it resumed after (None: none)
    step: int | None
    time: float  #: when it was caught (epoch s)
    #: a :class:`ConfigError`: an option or the launch is wrong, and every generation would meet it again
    misconfigured: bool = False
    #: a :class:`TrainingHealthError`, and why its ladder ends the run (None: re-run or rewind)
    unhealthy: bool = False
    refused: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Fault:
        d = json.loads(text)
        refused = d.get("refused")
        return cls(int(d["rank"]), str(d["error"]), str(d["kind"]),
                   None if d["step"] is None else int(d["step"]), float(d["time"]), d.get("misconfigured") is True,
                   d.get("unhealthy") is True, refused if isinstance(refused, str) else None)

    @classmethod
    def of(cls, err: Exception, *, rank: int, step: int | None) -> Fault:
        """``err`` as rank ``rank`` caught it, after ``step``."""
        unhealthy = isinstance(err, TrainingHealthError)
        refused = err.details.get("refused") if isinstance(err, TrainingHealthError) else None
        return cls(rank, f"{type(err).__name__}: {shorten(str(err))}", type(err).__name__, step, time.time(),
                   isinstance(err, ConfigError), unhealthy, refused if isinstance(refused, str) else None)

    @property
    def raised(self) -> Raised:
        """What the recovery plan weighs of it."""
        return Raised(self.kind, self.step, self.misconfigured, self.unhealthy, self.refused)


def run_restartable(rt: Runtime, train: Callable[[int], T], *, backend: str = "gloo",
                    max_in_process_restarts: int = 3, rejoin_timeout_s: float = 20.0,
                    timeout: datetime.timedelta | None = None) -> T:
    """Make the default process group (``backend``) and return ``train(generation)``; when it raises on a rank and
    every process lives, rebuild the group and call it again in the same processes (generation 1, 2, ...), without a
    new step or a requeue. ``train`` builds its model and loads the newest checkpoint itself, as a script's start
    does. Whether a fault is restarted is the recovery plan's to say: not an error after an agreed stop, a
    ConfigError, the same error at the same step twice, more than ``max_in_process_restarts``, nor a rank that does
    not come back within ``rejoin_timeout_s`` (its process died: the new step's or the requeue's); then the exception
    is raised, as without the wrapper (docs/guides/in-job.md)."""
    return InProcess(rt, backend=backend, max_in_process_restarts=max_in_process_restarts,
                     rejoin_timeout_s=rejoin_timeout_s,
                     timeout=timeout).run(train)


class InProcess:
    def __init__(self, rt: Any, *, backend: str, max_in_process_restarts: int, rejoin_timeout_s: float,
                 timeout: datetime.timedelta | None) -> None:
        # The project's figures (not a bare comparison): "20", True or nan is refused here, not deep in torch.
        if figures.count(max_in_process_restarts) is None or not (figures.seconds(rejoin_timeout_s) or 0.0) > 0:
            raise ConfigError("run_restartable(): max_in_process_restarts must be 0 or more and rejoin_timeout_s a "
                              "finite number of seconds above 0",
                              max_in_process_restarts=max_in_process_restarts, rejoin_timeout_s=rejoin_timeout_s)
        self.rt, self.backend, self.max_in_process_restarts = rt, backend, max_in_process_restarts
        self.rejoin_timeout_s, self.timeout = rejoin_timeout_s, timeout
        self.restarted: list[Fault] = []
        self._store: Any = None
        # The keys of this set of processes: a store that outlives them (torchrun's agent's, across its worker
        # restarts) holds an earlier set's keys too.
        t = rt.topology
        self._prefix = f"{PREFIX}/{t.restart_count}.{t.attempt}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._tasks: injob.EndedReader | None = None

    def run(self, train: Callable[[int], T]) -> T:
        dist = _dist()
        if dist.is_initialized():
            raise ConfigError("run_restartable() makes the default process group itself, for each generation: "
                              "call it instead of torch.distributed.init_process_group(), not after it")
        self._store = self._base_store(dist)
        generation = 0
        while True:
            self._init_group(dist, generation)
            watcher = self._watcher(dist, generation)
            try:
                return train(generation)
            except Exception as err:  # noqa: BLE001 - every rank's error is weighed; refused ones are raised
                caught = (time.time(), time.monotonic())  # this host's clock: no duration across two hosts' clocks
                watcher.raised()
                fault = self._post(generation, err)
                watcher.tell(FAULT)
                self._abort(dist, err)
                decision = self._decide(fault, generation)
                self._record(generation, fault, decision, caught)
                if decision.action is not Action.IN_PROCESS_RESTART:
                    raise
                self.restarted.append(fault)
                generation += 1
                self._restarted(generation)
            finally:
                watcher.close()

    def _decide(self, fault: Fault, generation: int) -> Decision:
        """The plan's decision about ``fault``; a restart stands only once every rank is back (else the plan's
        fallback, with the reason the rank that gave up set)."""
        limits = InProcessFacts(self.max_in_process_restarts, tuple(f.raised for f in self.restarted))
        decision = self.rt.parts.executor.in_process(fault.raised, limits, stop=self.rt.stop.decision)
        if decision.action is not Action.IN_PROCESS_RESTART:
            return decision
        why = self._rejoin(generation)
        if why is None:
            return decision
        assert decision.fallback is not None  # plan() gives every restart in the process its fallback
        return dataclasses.replace(decision.fallback, in_process_refused=why)

    # -- the store and the groups ------------------------------------------------------------------------------------
    def _base_store(self, dist: Any) -> Any:
        t = self.rt.topology
        timeout = datetime.timedelta(seconds=max(self.rejoin_timeout_s, 60.0))
        # Under torchrun its agent already holds a store there (TORCHELASTIC_USE_AGENT_STORE): every rank is a client.
        serve = t.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        return dist.TCPStore(t.master_addr, t.master_port, t.world_size, serve, timeout=timeout,
                             wait_for_workers=False)

    def _init_group(self, dist: Any, generation: int) -> None:
        t = self.rt.topology
        store = dist.PrefixStore(f"{self._prefix}/{generation}/", self._store)
        kwargs = {"timeout": self.timeout} if self.timeout is not None else {}
        dist.init_process_group(self.backend, store=store, rank=t.rank, world_size=t.world_size, **kwargs)

    def _watcher(self, dist: Any, generation: int) -> PeerAbort | _NoWatcher:
        """This generation's :class:`~.peerabort.PeerAbort` (not under gloo, whose peers fail on a closed socket)."""
        if dist.get_backend() == "gloo":
            return _NoWatcher()
        group = dist.group.WORLD
        watcher = PeerAbort(self._store, f"{self._prefix}/news/{generation}",
                            lambda: dist.distributed_c10d._abort_process_group(group))
        watcher.start()
        return watcher

    def _abort(self, dist: Any, err: BaseException) -> None:
        """This rank's groups closed at once, the agreement out of its round: peers waiting on it fail instead of
        waiting. The default group is let go of (:mod:`slurmrt.runtime.release`): gloo closes its connections only
        when nothing holds it."""
        self.rt.parts.abort()
        if not dist.is_initialized():
            return
        gloo = dist.get_backend() == "gloo"
        held = release(dist.group.WORLD, err, dist.distributed_c10d._abort_process_group)
        if held and gloo:
            logger.warning("the aborted default group is still held (%d reference(s)): gloo closes its connections "
                           "only when it is destroyed, so a peer in a collective with this rank waits for its timeout",
                           held)

    def _restarted(self, generation: int) -> None:
        """Every rank is back: the next generation starts as the first did, its saves in directories of its own."""
        self.rt.parts.restart(generation)

    # -- one fault -------------------------------------------------------------------------------------------------
    def _post(self, generation: int, err: Exception) -> Fault:
        """This rank's fault, posted unless a rank posted first; returns the first one."""
        # Where this generation got to: its last step, or before its first the step it resumed after (never a step
        # an earlier generation reached: a new fault there would read as the same error at the same step).
        step = self.rt.stop.generation_step
        mine = Fault.of(err, rank=self.rt.rank, step=step if step is not None else self.rt.resumed_step)
        try:
            first = self._store.compare_set(f"{self._prefix}/fault/{generation}", "", mine.to_json())
            return Fault.from_json(first.decode() if isinstance(first, bytes) else first)
        except Exception as store_err:  # noqa: BLE001 - the store's host is gone: no rejoin either
            logger.warning("the in-process restart's store does not answer (%s): this rank's own fault counts",
                           store_err)
            return mine

    def _rejoin(self, generation: int) -> str | None:
        """Every rank back, or why not, as one verdict for all: the first rank to see every rank arrived, or to give
        up (a rank refused, srun saw a task end, the rejoin time passed), sets it; each rank acts on the verdict, never
        on its own view, so no rank starts the next generation while another gives up."""
        arrived, world = f"{self._prefix}/arrived/{generation}", self.rt.topology.world_size
        deadline = time.monotonic() + self.rejoin_timeout_s
        try:
            self._store.add(arrived, 1)
            pause = 0.001
            while (verdict := self._verdict(generation, arrived, world, deadline)) is None:
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        except Exception as err:  # noqa: BLE001
            return f"the store does not answer ({type(err).__name__}: {err}): rank 0's process is probably gone"
        return None if verdict == GO else f"rank {verdict}"  # "N: why", as the rank that gave up set it

    def _verdict(self, generation: int, arrived: str, world: int, deadline: float) -> str | None:
        """The generation's verdict if set, or set now (first wins) when this rank can decide; None: wait on."""
        key = f"{self._prefix}/verdict/{generation}"
        if self._store.check([key]):
            return str(self._store.get(key).decode())
        missing = world - self._store.add(arrived, 0)
        why = self._why_not(missing, deadline) if missing > 0 else None
        if why == "":
            return None
        got = self._store.compare_set(key, "", GO if why is None else f"{self.rt.rank}: {why}")
        return got.decode() if isinstance(got, bytes) else str(got)

    def _why_not(self, missing: int, deadline: float) -> str:
        """Why ``missing`` ranks will not come back, or "" while they still may."""
        gone = self._ended()
        if gone:
            return f"srun saw task(s) {', '.join(map(str, gone))} end: their process is gone"
        if self.rt.stop.terminated:  # srun --kill-on-bad-exit ending the step, or the time limit: KillWait is left
            return "SIGTERM arrived while waiting: the step is ending"
        if time.monotonic() > deadline:
            return (f"{missing} rank(s) did not come back within {self.rejoin_timeout_s:.0f} s: their process is "
                    "probably gone")
        return ""

    def _ended(self) -> list[int]:
        """The tasks srun saw end, as ``slurmrt run`` tells (:class:`slurmrt.recovery.injob.EndedReader`)."""
        if self._tasks is None:
            self._tasks = injob.EndedReader(self.rt.parts.executor.facts.in_job,
                                            tasks_are_ranks=self.rt.topology.mode is LaunchMode.SRUN)
        return sorted(self._tasks())

    def _record(self, generation: int, fault: Fault, decision: Decision, caught: tuple[float, float]) -> None:
        """The executor records the generation's fault (rank 0, at the time it caught its own part of it, by its
        clock, as the events around it are: the first rank's time is another host's clock, and skew would read as
        recovery). A refusal before the rejoin is set as the verdict too, for the ranks still waiting."""
        why = decision.in_process_refused
        if why is not None and self._store is not None:
            with contextlib.suppress(Exception):  # the store's host is gone: the others time out instead
                self._store.compare_set(f"{self._prefix}/verdict/{generation}", "", f"{self.rt.rank}: {why}")
        self.rt.parts.executor.made_in_process(decision, generation=generation, rank=fault.rank, error=fault.error,
                                               step=fault.step, fault_time=caught[0],
                                               seconds=time.monotonic() - caught[1], lead=self.rt.rank == 0)


class _NoWatcher:
    """Under gloo: a peer's collective fails on the aborted rank's closed connections; nothing to watch."""

    def raised(self) -> None:
        pass

    def tell(self, news: str) -> None:
        pass

    def close(self) -> None:
        pass


def _dist() -> Any:
    dist = torch_distributed()
    if dist is None:
        import torch.distributed as dist
    return dist

