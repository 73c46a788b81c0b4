"""The stop controller: the step clock, the agreement on when to stop, phases, and what the training thread does.

``should_stop(step)`` is the per-step path: a clock read and a comparison on most steps. It measures the step time
(the deadline's input), records progress for the timeline, takes a finished background save's result, reports new
signals, and asks the agreement (:mod:`slurmrt.stop.agreement`), whose thread runs the rounds. Phases
(``rt.phase``) are timed here too, and left out of the step time. The activity and the heartbeat are this
controller's state, read by the hang watchdog on the watcher thread.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from typing import Protocol

from .. import _clock
from .._comm import Groups
from ..launch.topology import Topology
from .agreement import Agreement, DistributedAgreement, LocalAgreement
from .deadline import Budget, EndTime
from .decision import Contribution, Reason, StopDecision, contribution
from .killswitch import KillSwitch
from .settings import StopSection
from .signals import SignalRecorder
from .state import Activity, PhaseTimes, RunState
from .straggler import ComputeTimer, Straggler, StragglerJudge, Timing

__all__ = ["Collectives", "Nodes", "Recovery", "Reports", "Saves", "StopController"]

logger = logging.getLogger(__name__)


class Reports(Protocol):
    """What a stop says in the log and the event log: the signals, the agreed decision, progress, phases and
    stragglers (:class:`~slurmrt.runtime.report.Reporter`)."""

    signals_reported: int

    def new_signals(self, recorder: SignalRecorder, *, stalled: bool = False,
                    peers_ended: Callable[[], str | None] = ...) -> None: ...

    def decision(self, decision: StopDecision, *, steps_measured: int, step_s: float | None, save_s: float | None,
                 margin_s: float, worst_step_s: float | None = None) -> None: ...

    def progress(self, step: int, step_s: float | None, slurm_start: float | None = None) -> None: ...

    def phase(self, name: str, seconds: float) -> None: ...

    def straggler(self, s: Straggler, *, node: str | None, action: str, step: int | None = None) -> None: ...


class Collectives(Protocol):
    """slurmrt's groups, opened collectively on first use, and who must know the agreement (the exit hooks):
    :class:`~slurmrt.runtime.hooks.ProcessHooks`."""

    def groups(self) -> Groups: ...

    def watch(self, agreement: Agreement) -> None: ...


class Saves(Protocol):
    """The background save: its result taken per step (cheap), and waited for before a collective on the work group,
    which is the save's until it ends: :class:`~slurmrt.checkpoint.session.CheckpointSession`."""

    def poll(self) -> None: ...

    def settle(self) -> None: ...


class Nodes(Protocol):
    """The node of a rank, as the census placed it (:class:`~slurmrt.hang.monitor.HangMonitor`): a straggler's."""

    def node_of(self, rank: int) -> str | None: ...


class Recovery(Protocol):
    """Whether a stop would restart without a node: a spare under ``slurmrt run``, or a requeue
    (:class:`~slurmrt.recovery.executor.Executor`, from the plan)."""

    def can_leave_out(self, node: str, *, cause: str = "straggler") -> bool: ...

    def remember(self, nodes: list[str], why: str) -> None: ...


class StopController:
    def __init__(self, topology: Topology, settings: StopSection, report: Reports, *, state: RunState,
                 budget: Budget, end_time: EndTime, signals: SignalRecorder, kill_switch: KillSwitch | None,
                 phases: PhaseTimes, collectives: Collectives, saves: Saves, nodes: Nodes, recovery: Recovery) -> None:
        self.topology, self.settings, self._report = topology, settings, report
        self.budget, self._end, self._signals, self._switch = budget, end_time, signals, kill_switch
        self.phases = phases
        self._collectives, self._saves, self._nodes, self._recovery = collectives, saves, nodes, recovery
        self._last_tick: float | None = None
        #: What this controller shares with the hang monitor: the heartbeat (the last step boundary), the activity
        #: (changed at saves, loads and phases, not per step; None until the first should_stop: a program that
        #: never reports steps, Megatron-LM's own loop behind the bridge, is watched only in its saves, loads and
        #: phases), the agreement and the nodes to leave out.
        self.state = state
        rank0 = topology.rank == 0 and settings.progress_s is not None
        self._next_progress = 0.0 if rank0 else float("inf")  # rank 0 records its progress, from the first step
        self.decision: StopDecision | None = None
        #: The last step the training loop reported (should_stop, or a framework's stop): where the run really got
        #: to, recorded in its exit event (its last checkpoint may be older).
        self.last_step: int | None = None
        #: The last step reported since the last in-process restart (None before the generation's first): where a
        #: fault of this generation happened, never a step an earlier generation reached.
        self.generation_step: int | None = None
        #: Steps this run completed (between two should_stop calls): none means it stopped before its first.
        self.steps_done = 0
        #: ``rt.time_compute()``; the judge of the windows it closes (slurmrt.stop.straggler).
        self.timer = ComputeTimer(settings.straggler_window, budget.steps.estimate)
        self._judge = StragglerJudge(margin=settings.straggler_margin, windows=settings.straggler_windows)
        #: What a straggler is compared across: nodes (a restart leaves a node out), ranks in a job on one node.
        self._unit = topology.node_rank if topology.nnodes > 1 else topology.rank
        #: The straggler named last, and its node (None when the census could not place it).
        self.straggler: Straggler | None = None
        self.straggler_node: str | None = None
        self._replace_straggler = False
        self._suspect = False  #: a node computed a step wrong (rt.check): the next round stops to leave it out

    # -- the per-step path -----------------------------------------------------------------------------------------
    def should_stop(self, step: int, *, before: str | None = None) -> bool:
        now = _clock.mono()
        if len(self._signals.first_seen) != self._report.signals_reported:  # no call on the per-step path
            # Asked before this boundary counts as progress: a frozen rank that Slurm wakes is past its allowance.
            self._report.new_signals(self._signals, stalled=self.state.overdue(), peers_ended=self.state.peers_ended)
        if self._last_tick is not None:
            self.budget.step_done(now - self._last_tick)
            self.steps_done += 1
        self.state.heartbeat = now
        self.last_step = self.generation_step = step
        if now >= self._next_progress:
            self._progress(step, now)
        self._saves.poll()
        agreement = self.state.agreement or self._start_agreement()
        stop = agreement.should_stop(step)
        if stop and self.decision is None:
            assert agreement.decision is not None
            self._decided(agreement.decision)
        if before is not None and not stop:
            stop = self._phase_unfit(before, step)
        # The step clock restarts when this call returns: a wait for the agreement is not step time. Counting it
        # made slow rounds look like slow steps, which shrank the window and made training wait again.
        self._last_tick = _clock.mono()
        return stop

    def _progress(self, step: int, now: float) -> None:
        assert self.settings.progress_s is not None
        self._next_progress = now + self.settings.progress_s
        self._report.progress(step, self.budget.steps.estimate(), self._end.started)

    def _start_agreement(self) -> Agreement:
        self.state.activity = Activity("step", _clock.mono())  # the first step boundary: the start is over
        groups = self._collectives.groups()
        agreement: Agreement
        if groups.control is None:
            agreement = LocalAgreement(self._contribute)
        else:
            agreement = DistributedAgreement(self._contribute, groups.control,
                                             step_estimate=self.budget.steps.estimate, observe=self._observe)
            self._collectives.watch(agreement)
        self.state.agreement = agreement
        return agreement

    def _contribute(self, step: int, steps_ahead: int, agreed_end: float | None) -> Contribution:
        """This rank's view, read by the agreement (its thread, or the training thread for one process)."""
        return contribution(now=_clock.wall(), step=step, steps_ahead=steps_ahead,
                            signals=dict(self._signals.first_seen), kill_switch_seen=self._switch_seen(),
                            own_end=self._end.value, agreed_end=agreed_end, budget=self.budget,
                            deadline=self.settings.deadline, straggler=self._replace_straggler,
                            suspect=self._suspect,
                            timing=self.timer.timing(self.topology.rank, self._unit, self._judge.suspect))

    def _observe(self, timing: Timing) -> None:
        """Each round's reduced timing (the control thread): a straggler named, reported, and maybe replaced."""
        named = self._judge.observe(timing)
        if named is None:
            return
        node = self._nodes.node_of(named.rank)
        self.straggler, self.straggler_node = named, node
        # the nodes a restart leaves out by the options, read by the hang monitor too
        self.state.exclude = (node,) if node is not None and self.settings.straggler != "name" else ()
        action = self.settings.straggler
        step = self.agreement.last_step if self.agreement is not None else None
        self._report.straggler(named, node=node, action=action, step=step)
        if action == "replace" and node is not None:
            if self._recovery.can_leave_out(node):
                self._replace_straggler = True  # every rank names it at this round: the reason is raised together
            else:
                logger.warning("straggler=replace, but no restart can leave %s out (no spare node under `slurmrt "
                               "run`, and no requeue: requeue=False or not a Slurm job): training goes on with it",
                               node)

    def leave_out(self, step: int, nodes: list[str]) -> bool:
        """``nodes`` computed ``step`` wrong once (its re-run passed: rt.check found a transient fault): every rank
        calls this at the same step, and the next round stops the run to restart without them (the plan's, as for a
        node that failed its health check). With no restart that could leave them out, training goes on with them
        and the ledger keeps them out of the next jobs. True: they are left out."""
        why = f"computed step {step} wrong once (rt.check: its re-run passed)"
        if all(self._recovery.can_leave_out(n, cause="unhealthy") for n in nodes):  # as the stop is planned
            self.state.exclude = tuple(dict.fromkeys((*self.state.exclude, *nodes)))
            self._suspect = True  # every rank at this step: the reason is raised together
            if self.topology.rank == 0:
                logger.warning("%s %s: stopping at the next agreed step to restart without %s", ", ".join(nodes),
                               why, "it" if len(nodes) == 1 else "them")
            return True
        if self.topology.rank == 0:
            them = "it" if len(nodes) == 1 else "them"
            logger.warning("%s %s, but no restart can leave %s out (no spare node under `slurmrt run`, and no "
                           "requeue: requeue=False or not a Slurm job): training goes on; the bad-node ledger has %s",
                           ", ".join(nodes), why, them, them)
            self._recovery.remember(nodes, why)
        return False

    @property
    def exclude_nodes(self) -> list[str]:
        """Nodes the next restart must leave out by the options: the straggler's, with "exclude" or "replace"."""
        return list(self.state.exclude)

    def _switch_seen(self) -> bool:
        return self._switch is not None and self._switch.seen is not None

    def _decided(self, decision: StopDecision) -> None:
        self.decision = decision
        self._report.decision(decision, steps_measured=len(self.budget.steps), step_s=self.budget.steps.estimate(),
                              save_s=self.budget.saves.estimate(), margin_s=self.settings.deadline_margin_s,
                              worst_step_s=self.budget.steps.peak)

    # -- phases ----------------------------------------------------------------------------------------------------
    def _phase_unfit(self, name: str, step: int) -> bool:
        """Agree whether phase ``name`` still fits before the end; True: stop at ``step``, before it."""
        phase_s, end = self.phases.get(name), self.end_time
        unfit = phase_s is not None and end is not None and self.settings.deadline and \
            not self.budget.phase_fits(now=_clock.wall(), end=end, phase_s=phase_s)
        self._saves.settle()
        if self._collectives.groups().work.all_ok(not unfit):
            return False
        if self.decision is None:
            logger.warning("phase %r (%.0f s measured) no longer fits before the end: stopping before it", name,
                           phase_s or 0.0)
            self._decided(StopDecision(step, frozenset({Reason.DEADLINE}), True, end, None))
        return True

    @contextlib.contextmanager
    def phase(self, name: str, *, timeout_s: float | None = None) -> Iterator[None]:
        outer = self.state.activity
        start = _clock.mono()
        self.state.activity = Activity("phase", start, name, timeout_s)
        ok = False
        try:
            yield
            ok = True
        finally:
            seconds = _clock.mono() - start
            if ok:
                self.phases.add(name, seconds)
                self._report.phase(name, seconds)
            self.state.activity = outer.resumed(_clock.mono()) if outer else None
            self.restart_step_clock()

    @contextlib.contextmanager
    def doing(self, kind: str) -> Iterator[None]:
        """The training thread is in a save or a load: the watchdog gives it a save's allowance."""
        outer = self.state.activity
        self.state.activity = Activity(kind, _clock.mono())
        try:
            yield
        finally:
            self.state.activity = outer.resumed(_clock.mono()) if outer else None

    def restart(self) -> None:
        """An in-process restart: the agreement thread leaves its round (its peers' rounds fail, or already failed),
        and the next ``should_stop`` opens a new agreement on the new groups. The step clock starts again there."""
        agreement, self.state.agreement = self.state.agreement, None
        if agreement is not None:
            agreement.abandon(collectively=False)
        self.state.activity = None  # the watchdog watches the new start as it watched the first
        self._last_tick = None
        self.generation_step = None

    @property
    def terminated(self) -> bool:
        """SIGTERM arrived (srun ending the step, the time limit, a preemption): the process has KillWait left."""
        return signal.SIGTERM in self._signals.first_seen

    def restart_step_clock(self) -> None:
        self._last_tick = None
        self.state.heartbeat = _clock.mono()

    # -- the framework layer ---------------------------------------------------------------------------------------
    def local_reasons(self) -> frozenset[Reason]:
        c = contribution(now=_clock.wall(), step=0, steps_ahead=0, signals=dict(self._signals.first_seen),
                         kill_switch_seen=self._switch_seen(), own_end=self._end.value, agreed_end=None,
                         budget=self.budget, deadline=False)
        return c.reasons

    def stopped(self, reasons: frozenset[Reason], *, step: int, term_time: float | None = None) -> StopDecision:
        self.last_step = self.generation_step = step
        work = self._collectives.groups().work
        # Gathered to rank 0 and its union sent back, both over the work group's tree: O(log N) hops each, not a ring.
        gathered = work.gather((sorted(r.value for r in reasons), term_time))
        merged: tuple[list[str], float | None] | None = None
        if gathered is not None:
            terms = [t for _, t in gathered if t is not None]
            merged = (sorted({v for values, _ in gathered for v in values}), min(terms) if terms else None)
        values, first_term = work.broadcast(merged)
        union = frozenset(Reason(v) for v in values)
        decision = StopDecision(step, union, True, self.end_time, first_term)
        if union:
            self._decided(decision)
        return decision

    @property
    def agreement(self) -> Agreement | None:
        """The agreement on when to stop, once the first step opened it."""
        return self.state.agreement

    @property
    def end_time(self) -> float | None:
        return self._end.value or (self.agreement.end_time if self.agreement is not None else None)

    def end_rounds(self) -> None:
        if self.agreement is not None:
            self.agreement.end_rounds()
