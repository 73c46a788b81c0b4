"""After a hang or a lost peer: every rank says where it is stuck, and the ranks name the suspect.

The census runs through the rendezvous store of ``torch.distributed`` (a key-value server every rank already talks
to), not through a collective: a collective is exactly what no longer completes. The first rank that finds a hang
opens the census; every rank whose training thread is stalled looks for an open census at each watchdog poll (one
store request, and only while stalled) and answers with its :class:`RankState`. A rank that never answers is dead,
or its whole process is frozen.

Who is a suspect (:func:`name_suspects`): the ranks that do not answer, and the ranks whose training thread is not
waiting for its peers (it is in user code, in a write, in a compile: anywhere but a collective). A rank waiting in a
collective is only waiting for a suspect. When every rank waits, or every rank is busy (NCCL waits on the GPU, in
user code, so its stacks cannot tell), the ranks behind the others are the suspects; failing that, there is none.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from .._errors import SlurmrtError
from .quiet import hushed

__all__ = ["CALL_TIMEOUT_S", "Census", "CensusError", "RankState", "main_thread_state", "name_suspects"]

logger = logging.getLogger(__name__)

#: A training thread whose innermost frame (outside the standard library's threading) is in one of these waits
#: for its peers.
_WAITING_IN = ("torch/distributed/", "slurmrt/_comm.py", "slurmrt/_tree.py", "slurmrt/stop/agreement.py")
#: How long one request to the rendezvous store may take before the store counts as gone: it answers in
#: milliseconds while its host runs.
CALL_TIMEOUT_S = 30.0


class CensusError(SlurmrtError, RuntimeError):
    """The store does not answer (its host, rank 0's node by default, is gone)."""


@dataclass(frozen=True)
class RankState:
    rank: int
    node: str
    step: int | None  # the last step boundary the training thread passed
    waiting: bool  # the training thread waits inside a collective
    where: str  # its innermost frame, "file:line in function"
    idle_s: float
    kill_switch: bool = False
    #: The rank's program ended on an exception of its own (this is its error): a software error, not a bad node.
    crashed: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> RankState:
        return cls(**json.loads(text))


def main_thread_state() -> tuple[bool, str]:
    """(waiting in a collective, innermost frame) of the main thread, as seen from another thread."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None and frame.f_code.co_filename.endswith("threading.py"):
        frame = frame.f_back
    if frame is None:
        return False, "unknown"
    path = frame.f_code.co_filename.replace("\\", "/")
    where = f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"
    return any(part in path for part in _WAITING_IN), where


def name_suspects(states: dict[int, RankState], world: int) -> tuple[list[int], str]:
    """The suspect ranks and why, from the answers ``states`` of a census over ``world`` ranks (see the module)."""
    missing = [r for r in range(world) if r not in states]
    busy = sorted(r for r, s in states.items() if not s.waiting)
    if missing and len(missing) < world:
        return _silent(missing, busy, len(states))
    if busy and len(busy) < world:
        where = "; ".join(f"rank {r}: {states[r].where}" for r in busy[:4])
        return busy, f"rank(s) {_ranks(busy)} are not in a collective while the others wait for them ({where})"
    return _behind(states, busy)


def _silent(missing: list[int], busy: list[int], answered: int) -> tuple[list[int], str]:
    """Some ranks did not answer: they are the suspects, and so are ranks that answered busy while others wait."""
    why = f"rank(s) {_ranks(missing)} did not answer (dead, or the whole process is frozen)"
    if busy and len(busy) < answered:
        return sorted(missing + busy), why + f"; rank(s) {_ranks(busy)} are not waiting for their peers"
    return missing, why


def _behind(states: dict[int, RankState], busy: list[int]) -> tuple[list[int], str]:
    """Every rank answered, all waiting or all busy: the ranks at the lowest step, if the steps differ."""
    steps = {r: s.step for r, s in states.items() if s.step is not None}
    if steps and len(set(steps.values())) > 1:
        low = min(steps.values())
        behind = sorted(r for r, s in steps.items() if s == low)
        return behind, f"rank(s) {_ranks(behind)} are behind the others (step {low})"
    return [], "no rank stands out: every rank " + ("waits for the others (a mismatched collective?)"
                                                     if not busy else "is busy, at the same step")


def _ranks(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    return ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


class Census:
    """One run's census, in ``store`` under ``prefix`` (keys: ``open``, ``rank/<r>``, ``node/<r>``, ``done``, and
    the counters ``answered`` and ``acked``).

    Its cost on the store (rank 0's process hosts it) does not grow with the ranks while it waits: the leader polls
    one counter, not every rank's key, and reads the answers once (one ``multi_get`` when all came); the others wait
    for the verdict inside the store (``wait``), not by polling it. At 16,384 ranks, polling every key every 0.2 s
    was about 80,000 requests a second on rank 0.
    """

    def __init__(self, store: Any, *, prefix: str, rank: int, world: int) -> None:
        self._store, self._prefix, self.rank, self.world = store, prefix, rank, world

    def _call(self, what: str, *args: Any) -> Any:
        """One request to the store, bounded: c10d's ``set``, ``add`` and ``check`` wait for the answer without any
        timeout, and a store whose host is stopped (SIGSTOP, a frozen node: its socket stays open) never answers
        (measured). The request runs on a thread of its own; after CALL_TIMEOUT_S it is given up for lost."""
        result: dict[str, Any] = {}

        def request() -> None:
            try:
                with hushed():  # its failure is said below, in one line: not torch's C++ stack as well
                    result["value"] = getattr(self._store, what)(*args)
            except Exception as err:  # the store's errors are RuntimeError, DistStoreError, ... : all mean "gone"
                result["error"] = err

        thread = threading.Thread(target=request, name="slurmrt-census-request", daemon=True)
        thread.start()
        thread.join(CALL_TIMEOUT_S)
        if thread.is_alive():
            raise CensusError(f"the rendezvous store does not answer ({what}) within {CALL_TIMEOUT_S:.0f} s: the "
                              "process that hosts it (rank 0) is stopped, or its node no longer answers")
        if "error" in result:
            raise CensusError(f"the rendezvous store does not answer ({what}): {result['error']}") \
                from result["error"]
        return result.get("value")

    def register(self, node: str) -> None:
        """Record this rank's node at the start of the run, so that a rank that dies can still be placed."""
        self._call("set", f"{self._prefix}node/{self.rank}", node)

    def open(self) -> None:
        self._call("set", f"{self._prefix}open", "1")

    def is_open(self) -> bool:
        return bool(self._call("check", [f"{self._prefix}open"]))

    def answer(self, state: RankState) -> None:
        """This rank's state, counted once (a rank that answers again, after a crash report, replaces its answer)."""
        key = f"{self._prefix}rank/{state.rank}"
        first = not self._call("check", [key])
        self._call("set", key, state.to_json())
        if first:
            self._call("add", f"{self._prefix}answered", 1)

    def collect(self, wait_s: float | Callable[[], float],
                ended: Callable[[], Iterable[int]] | None = None) -> dict[int, RankState]:
        """The answers, waiting up to ``wait_s`` for every rank's (a callable is asked again at each poll: the
        wait can shrink while it runs, when Slurm starts to take the step down), and not for a rank that ``ended``
        names (srun saw its task end: it will never answer). Polls the count of answers."""
        answered = self._answers(wait_s, ended)
        keys = [f"{self._prefix}rank/{r}" for r in range(self.world)]
        if answered >= self.world and self._call("check", keys):  # every key there (check: all of them, or False)
            try:
                values = self._call("multi_get", keys)
            except CensusError as err:  # a store without multi_get: read them one by one below
                logger.debug("multi_get: %s", err)
            else:
                return {r: RankState.from_json(v) for r, v in enumerate(values)}
        states: dict[int, RankState] = {}
        for r, key in enumerate(keys):  # some never answered: look at each key, once
            if self._call("check", [key]):
                states[r] = RankState.from_json(self._call("get", key))
        return states

    def _answers(self, wait_s: float | Callable[[], float], ended: Callable[[], Iterable[int]] | None) -> int:
        """How many ranks answered, once all did (or all but the ranks that ended without answering), or ``wait_s``
        is over."""
        start = time.monotonic()
        while True:
            answered = int(self._call("add", f"{self._prefix}answered", 0))
            limit = wait_s() if callable(wait_s) else wait_s
            if answered >= self.world or time.monotonic() - start >= limit or \
                    (ended is not None and answered + self._silent(ended()) >= self.world):
                return answered
            time.sleep(0.2)

    def _silent(self, ended: Iterable[int]) -> int:
        """How many of the ranks that ``ended`` are this census's and never answered (one request each)."""
        gone = {r for r in ended if 0 <= r < self.world and r != self.rank}
        return sum(1 for r in gone if not self._call("check", [f"{self._prefix}rank/{r}"]))

    def nodes(self, ranks: Iterable[int]) -> dict[int, str]:
        """The nodes the ranks registered; the ranks that did not register are left out."""
        out = {}
        for r in ranks:
            key = f"{self._prefix}node/{r}"
            if self._call("check", [key]):
                value = self._call("get", key)
                out[r] = value.decode() if isinstance(value, bytes) else str(value)
        return out

    def finish(self, verdict: str) -> None:
        """The leader decided (and requeued): the others may exit."""
        self._call("set", f"{self._prefix}done", verdict)

    def wait_finished(self, wait_s: float) -> str | None:
        """Wait for the leader's verdict, then acknowledge it (the leader's process may host the store: it waits
        for the acknowledgements before it exits). The wait is the store's own (one request), not a poll."""
        key = f"{self._prefix}done"
        try:
            with hushed():
                self._store.wait([key], timedelta(seconds=max(wait_s, 0.001)))
        except Exception as err:  # a timeout, or the store is gone: one more request tells which
            if not self._call("check", [key]):
                logger.debug("no verdict within %.1f s: %s", wait_s, err)
                return None
        value = self._call("get", key)
        self._call("add", f"{self._prefix}acked", 1)
        return value.decode() if isinstance(value, bytes) else str(value)

    def wait_acknowledged(self, ranks: Iterable[int], wait_s: float) -> None:
        """Wait until every other rank of ``ranks`` acknowledged the verdict (polls the count of acknowledgements)."""
        deadline = time.monotonic() + wait_s
        expected = sum(1 for r in ranks if r != self.rank)
        while int(self._call("add", f"{self._prefix}acked", 0)) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
