"""What a rank does when its training thread is hung, or a peer is lost: on the watcher thread, the only one left.

1. Write the stack of every thread (faulthandler) to the rank's log and to the event log.
2. If the kill switch was seen: cancel the job and exit 0, as the switch means (no requeue, no checkpoint).
3. Take the census (:mod:`slurmrt.hang.census`) and name the suspects.
4. The census leader (the lowest rank that answered) hands the suspects' nodes to the recovery executor
   (:mod:`slurmrt.recovery`: a new step on a spare, or the requeue without them, as the plan decides), and tells
   the others.
5. Exit with :attr:`ExitCode.HUNG` (``os._exit``: the training thread cannot be joined), so that
   ``srun --kill-on-bad-exit=1`` takes down the step. No checkpoint: the thread that would write it is the one stuck.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..launch.topology import LaunchMode, Topology
from ..log import exit_now
from ..record.events import Event, read_events
from ..record.runs import Run, run_of
from ..recovery import injob
from ..recovery.executor import Executor
from ..recovery.plan import Trigger, plan
from ..recovery.policy import ExitCode
from ..stop.decision import Reason, StopDecision
from .census import Census, CensusError, RankState, main_thread_state, name_suspects
from .ended import SeenEnded, describe
from .stacks import pattern, stacks_file, write
from .watchdog import Hang

#: How long the census and its hand-over may wait once Slurm takes the step down (see HangResponse.terminating).
HURRIED_S = 3.0

__all__ = ["HURRIED_S", "HangResponse", "all_stacks", "exit_now", "is_peer_failure", "unhealthy"]

logger = logging.getLogger(__name__)


def all_stacks() -> str:
    """The stack of every thread of this process, as faulthandler writes it (it needs a real file)."""
    with tempfile.TemporaryFile(mode="w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def is_peer_failure(err: BaseException | None) -> bool:
    """An exception that says a peer is gone: a collective that failed on a closed connection, or the agreement; or
    one raised while such an exception was being handled (a clean-up that failed on its way out, as a buffer that
    cannot be closed while the failed send still holds it, must not hide the lost peer)."""
    seen: list[BaseException] = []
    while err is not None and len(seen) < 16 and all(err is not e for e in seen):
        if _says_peer_gone(err):
            return True
        seen.append(err)
        err = err.__cause__ or err.__context__
    return False


def _says_peer_gone(err: BaseException) -> bool:
    from .._errors import AgreementError

    if isinstance(err, AgreementError):
        return True
    text = str(err)
    if "EADDRINUSE" in text or "ddress already in use" in text:
        return False  # this rank's own bind failed (its port is taken): nobody else is lost
    return type(err).__name__ in {"DistBackendError", "DistNetworkError"} or any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


@dataclass
class HangResponse:
    topology: Topology
    #: Decides and carries out what the job does about the hang (the census leader calls it).
    executor: Executor
    #: The kill switch was seen, here or by any rank (through the agreement).
    kill_switch_seen: Callable[[], bool]
    last_step: Callable[[], int | None]
    #: This run's census, or None for one process / no store.
    census: Callable[[], Census | None]
    #: Sets how long the census waits for every answer.
    census_wait_s: float = 20.0
    #: Cancels the job and exits 0 (the kill switch).
    cancel: Callable[[float], Any] | None = None
    #: True once SIGTERM arrived: Slurm takes the step down (``--kill-on-bad-exit``, a requeue, scancel) and kills
    #: the process after KillWait (30 s by default). Every wait then shrinks to :data:`HURRIED_S`: the leader must
    #: requeue before that, and slurmd answers the step's cancel only once its tasks are gone. Measured on the test
    #: cluster: when that answer took longer than MessageTimeout (10 s), slurmctld queued the signal for a retry,
    #: which reached the *requeued* run's step of the same id a minute later and stopped it.
    terminating: Callable[[], bool] = lambda: False
    #: Nodes to leave out besides the suspects' (a straggler's, with straggler="exclude" or "replace").
    also_exclude: Callable[[], list[str]] = lambda: []
    _once: threading.Lock = field(default_factory=threading.Lock)
    #: The tasks srun saw end (rank: node, how), read at most twice a second.
    _seen: SeenEnded = field(init=False)

    def __post_init__(self) -> None:
        self._seen = SeenEnded(injob.EndedReader(self.executor.facts.in_job,
                                                 tasks_are_ranks=self.topology.mode is LaunchMode.SRUN))

    def hung(self, hang: Hang) -> NoReturn:
        """The watchdog fired on this rank."""
        what = hang.activity.describe()
        self._respond(Trigger.HANG, f"{what} made no progress for {hang.idle_s:.0f} s (allowed {hang.allowed_s:.0f} s)",
                      activity=hang.activity.kind, name=hang.activity.name, idle_s=round(hang.idle_s, 1),
                      allowed_s=round(hang.allowed_s, 1), idle=hang.idle_s)

    def joined(self, idle_s: float) -> NoReturn:
        """Another rank opened the census while this one was stalled."""
        self._respond(Trigger.HANG, f"a peer found the job hung; this rank was stalled for {idle_s:.0f} s",
                      activity="stalled",
                      idle_s=round(idle_s, 1), idle=idle_s)

    def crashed(self, err: BaseException) -> None:
        """This rank's program ends on an exception of its own: say so, where the others look (the census and the
        event log), so that they do not take the peer they lose for a bad node. Returns: the exit goes on."""
        t = self.topology
        error = f"{type(err).__name__}: {str(err)[:300]}"
        self.executor.events.emit(Event.CRASH, error=error, node=t.hostname)
        census = self.census()
        if census is not None:
            with contextlib.suppress(CensusError):
                census.answer(RankState(t.rank, t.hostname, self.last_step(), True, f"exception: {error}", 0.0,
                                        crashed=error))

    def _crash_seen(self, states: dict[int, RankState]) -> str | None:
        """A rank that crashed on an error of its own, from the census or this run's event log."""
        for s in states.values():
            if s.crashed:
                return f"rank {s.rank} ended on {s.crashed}"
        path = self.executor.events.path
        if path is not None and path.exists():
            for e in read_events(path, own=True):
                if e.get("event") == Event.CRASH.value and e.get("restart") == self.topology.restart_count:
                    return f"rank {e.get('rank')} ended on {e.get('error')}"
        return None

    def _answered_already(self) -> Run | None:
        """This run (this restart and in-job attempt) when a leading rank recorded its exit, or None."""
        t = self.topology
        run = run_of(self.executor.events.path, t.restart_count, t.attempt)
        return run if run is not None and run.exit is not None else None

    def lost_peer(self, err: BaseException) -> NoReturn:
        """The program is ending on an exception that says a peer is gone: this rank was in a collective that
        failed, a victim, not a suspect."""
        self._respond(Trigger.RANK_LOST, f"a peer was lost: {type(err).__name__}: {str(err)[:300]}",
                      activity="lost_peer", idle=0.0,
                      victim=f"{type(err).__name__}: {str(err)[:200]}")

    def peer_ended(self, idle_s: float, *, in_step: bool = False) -> None:
        """The training thread is stalled (in a collective that does not fail: NCCL waits on the GPU; gloo, at times,
        on a send to a peer that is gone: :mod:`slurmrt._tree`). When srun saw a peer's task end on a signal or an
        error, that peer is lost: respond. When, stalled inside a step (``in_step``), srun saw a peer end on an
        answer of slurmrt's own, the job's answer is made and the step comes down: this rank, which can only be
        waiting for that peer, joins the answer now rather than at its own allowance (a rank woken from SIGSTOP,
        whose allowance may be longer than Slurm's kill wait). Returns when srun saw neither."""
        me = self.topology.rank
        lost = self._seen.lost(me)
        if lost:
            what = describe(lost)
            self._respond(Trigger.RANK_LOST, f"a peer was lost: srun saw {what} end while this rank waited "
                          f"{idle_s:.0f} s", activity="lost_peer", idle=idle_s, victim=f"srun saw {what} end")
        answered = self._seen.answered(me) if in_step else {}
        if answered:
            self._respond(Trigger.HANG, f"srun saw {describe(answered)} end on an answer of slurmrt's own while this "
                          f"rank waited {idle_s:.0f} s in a step: joining it", activity="stalled", idle=idle_s,
                          idle_s=round(idle_s, 1))

    def peers_ended(self) -> str | None:
        """The peers srun saw end so far, in words, or None (none, or no ``slurmrt run`` to tell)."""
        ended = {r: e for r, e in self._seen().items() if r != self.topology.rank}
        return describe(ended) if ended else None

    def _respond(self, trigger: Trigger, what: str, *, idle: float, victim: str | None = None,
                 **detail: Any) -> NoReturn:
        if not self._once.acquire(blocking=False):
            # The other thread responds already (the watcher found the hang, then the training thread's collective
            # failed as the peers left, or the other way round): it ends the process.
            threading.Event().wait()
        step = self.last_step()
        since = time.time()
        state = self._record(what, step, idle, victim, detail)
        census, states, store_lost = self._gather(state)
        self._exit_if_not_a_node(states, idle, step)
        suspects, why, nodes, lead = self._suspects(census, states, store_lost)
        if trigger is Trigger.HANG and self._seen.all_lost(suspects, states):
            trigger = Trigger.RANK_LOST  # every suspect's task was seen to end: a lost peer, and recorded as one
        if not self._leads(lead):
            if census is not None and not store_lost:
                with contextlib.suppress(CensusError):
                    census.wait_finished(self._wait(60.0))
            self._exit(ExitCode.HUNG)
        bad = self._name(suspects, why, nodes, states)
        decision = self.executor.recover(trigger, nodes=bad, step=step,
                                         detail=f"{what}; suspects {suspects or 'none'}: {why}",
                                         about={"since": since, "suspects": why,
                                                "stacks": pattern(self.executor.events.path, self.topology)})
        if census is not None and not store_lost:
            with contextlib.suppress(CensusError):
                census.finish(decision.why)
                census.wait_acknowledged(states, self._wait(10.0))  # this process may host the store
        self._exit(ExitCode(decision.code))

    def _record(self, what: str, step: int | None, idle: float, victim: str | None,
                detail: dict[str, Any]) -> RankState:
        """All stacks to the log and a ``hang`` event; this rank's state for the census."""
        t = self.topology
        stacks = all_stacks()
        waiting, where = (True, victim) if victim is not None else main_thread_state()
        path = stacks_file(self.executor.events.path, t)
        if write(path, f"rank {t.rank} on {t.hostname}: {what}; the training thread is at {where}", stacks):
            # One line: the stacks of every rank would bury what the leader says next (issue 39).
            logger.info("rank %d on %s: %s%s; its stacks: %s", t.rank, t.hostname, what,
                        "" if victim is not None else f"; the training thread is at {where}", path)
        else:
            logger.error("rank %d on %s: %s; the training thread is at %s. Stacks of every thread:\n%s", t.rank,
                         t.hostname, what, where, stacks)
        self.executor.events.emit(Event.HANG, node=t.hostname, step=step, where=where, waiting=waiting,
                                  stacks=stacks, **detail)
        return RankState(t.rank, t.hostname, step, waiting, where, round(idle, 1), kill_switch=self.kill_switch_seen())

    def _exit_if_not_a_node(self, states: dict[int, RankState], idle: float, step: int | None) -> None:
        """The kill switch was seen (cancel, exit 0), or a rank crashed on an error of its own (no bad node: the
        plan's code for a software error). The lowest rank that answered the census records the run's end through
        the executor, as every other end is recorded, unless a rank did already (one that lost the store hosted by
        the one that answered first counts only itself); the others take the plan's code."""
        # Shape: two ends not a node's fault (kill switch, crash): each recorded once by the first rank, then exit
        first = not states or min(states) == self.topology.rank
        if any(s.kill_switch for s in states.values()):
            if first and self._answered_already() is None:  # the event log is read only for such an end
                self.executor.recover(Trigger.STOPPED, stop=StopDecision(step or 0, frozenset({Reason.KILL_SWITCH}),
                                                                         save=False),
                                      step=step, detail=f"the kill switch, seen while the loop was hung {idle:.0f} s")
            if self.cancel is not None and self.topology.local_rank == 0:
                self.cancel(idle)
            self._exit(ExitCode.FINISHED)
        crash = self._crash_seen(states)
        if crash is not None:
            decision = self.executor.recover(Trigger.SOFTWARE_ERROR, step=step, detail=crash) \
                if first and self._answered_already() is None else plan(Trigger.SOFTWARE_ERROR, self.executor.facts)
            logger.error("%s: %s", crash, decision.why)
            self._exit(ExitCode(decision.code))

    def _leads(self, lead: bool) -> bool:
        """Whether this rank acts for the job: the census says so, and no leader acted for this run already."""
        answered = self._answered_already() if lead else None
        if answered is not None:
            self._answered(answered)
        return lead and answered is None

    def _answered(self, run: Run) -> None:
        """This run's response was made already. A rank that was frozen (SIGSTOP, a process stuck in the kernel)
        wakes when Slurm takes the step down (SIGCONT, SIGTERM), finds its peers gone and the store with them, and
        would name the leader's node: it says what happened (INFO: the recovery worked) and makes the requeue only
        if its maker was killed before it could. Returns when there was none to make."""
        chosen = run.exit or {}
        logger.info("this run's response was made already (rank %s: %s): not responding again", chosen.get("rank"),
                    chosen.get("why"))
        made = self.executor.complete_requeue(run)
        if made is not None:
            self._exit(ExitCode(made.code))

    @staticmethod
    def _chosen_code(run: Run) -> ExitCode:
        """The exit code the response chose for ``run`` (HUNG when its record does not say one)."""
        code = (run.exit or {}).get("code")
        try:
            return ExitCode(code) if type(code) is int else ExitCode.HUNG  # a bool or a string is no code
        except ValueError:  # a number the record should not hold (a damaged or foreign line)
            return ExitCode.HUNG

    def _name(self, suspects: list[int], why: str, nodes: dict[int, str], states: dict[int, RankState]) -> list[str]:
        """Log and record the suspects; the nodes to leave out (theirs, and a straggler's)."""
        bad = sorted(set(nodes.values()))
        extra = [n for n in self.also_exclude() if n not in bad]
        if extra:
            logger.info("also leaving out straggler node(s) %s", ", ".join(extra))
        files = pattern(self.executor.events.path, self.topology)
        # INFO: what was found; the decision's line that follows says ERROR only when the job cannot go on by itself.
        logger.info("suspects: %s (%s); node(s) %s%s", suspects or "none", why, ", ".join(bad) or "none",
                     f"; every rank's stacks: {files}" if files else "")
        named = [{"rank": r, "node": nodes.get(r), "where": states[r].where if r in states else None,
                  "step": states[r].step if r in states else None} for r in suspects]
        self.executor.events.emit(Event.SUSPECTS, suspects=named, nodes=bad, why=why, lead=True)
        return sorted(bad + extra)

    def _gather(self, state: RankState) -> tuple[Census | None, dict[int, RankState], bool]:
        """Every rank's state through the census (only this rank's without one), and whether the store is lost."""
        census = self.census()
        if census is None:
            return None, {state.rank: state}, False
        try:
            if not census.is_open():
                census.open()
            census.answer(state)
            return census, census.collect(lambda: self._wait(self.census_wait_s), self._seen), False
        except CensusError as err:
            answered = self._answered_already()  # a frozen rank that woke after the answer: nobody to name
            if answered is not None:
                self._answered(answered)
                self._exit(self._chosen_code(answered))  # the kill switch's 0, a requeue's code
            # INFO, as the suspects' line: what was found. The decision's line says ERROR only when the job cannot
            # go on by itself.
            logger.info("%s: naming rank 0's node, whose process hosts the store", err)
            return census, {state.rank: state}, True

    def _suspects(self, census: Census | None, states: dict[int, RankState], store_lost: bool
                  ) -> tuple[list[int], str, dict[int, str], bool]:
        """(suspects, why, their nodes, whether this rank leads the response)."""
        t = self.topology
        if census is None:  # no store to meet in (or one process): this rank knows only itself
            return [], "no census (no rendezvous store): nobody can be named", {}, True
        if store_lost:  # nobody can coordinate: one process per node requeues (the rest fail)
            nodes = {0: t.nodelist[0]} if t.nodelist else {}
            return [0], "the rendezvous store no longer answers: rank 0, which hosts it, is gone", nodes, \
                t.local_rank == 0
        suspects, why = name_suspects(states, t.world_size)
        nodes = {r: states[r].node for r in suspects if r in states}
        with contextlib.suppress(CensusError):
            nodes.update(census.nodes(r for r in suspects if r not in nodes))
        return suspects, why + self._seen.saying(suspects, states), nodes, min(states) == t.rank

    def _wait(self, seconds: float) -> float:
        return min(seconds, HURRIED_S) if self.terminating() else seconds

    def _exit(self, code: ExitCode) -> NoReturn:
        exit_now(code)


def unhealthy(executor: Executor, failures: list[str], *, nodes: list[str], node: str) -> NoReturn:
    """The health check failed on ``nodes``: recover without them (a new step, or the requeue), and exit with
    ExitCode.UNHEALTHY."""
    logger.error("health check failed on %s: %s", ", ".join(nodes), "; ".join(failures))
    executor.events.emit(Event.HEALTH, ok=False, failed=failures, nodes=nodes, node=node)
    done = executor.recover(Trigger.UNHEALTHY, nodes=nodes, detail="health check: " + "; ".join(failures))
    exit_now(done.code)
