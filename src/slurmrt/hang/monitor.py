"""The hang monitor of one run: the watchdog, the census, the response and the start-up barrier, wired together.

``init()`` builds one; the :class:`~slurmrt.Runtime` only hands it the first collective and the uncaught exception
that ends the program. Detection (:class:`~slurmrt.hang.watchdog.Watchdog`, polled on the watcher thread) stays apart
from the response (:class:`~slurmrt.hang.response.HangResponse`); this class gives both what they ask about the run:
the last agreed step, whether the kill switch was seen, whether SIGTERM came, and the census in the rendezvous store.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import re
import signal
from typing import Any

from .._comm import torch_distributed
from ..launch.topology import Topology
from ..recovery.executor import Executor
from ..recovery.policy import ExitCode
from ..stop.deadline import Budget
from ..stop.decision import Reason
from ..stop.killswitch import KillSwitch, cancel_and_exit
from ..stop.signals import SignalRecorder
from ..stop.state import PhaseTimes, RunState
from .census import Census, CensusError
from .response import HangResponse, exit_now, is_peer_failure, unhealthy
from .settings import HangSection
from .stacks import quiet_peer_tracebacks, stacks_file
from .watchdog import Watchdog

__all__ = ["HangMonitor"]

logger = logging.getLogger(__name__)

#: Rank 0 learns which ranks missed the start-up barrier from torch's message ("Ranks 1, 3 failed to pass
#: monitoredBarrier"); the others only that rank 0 gave up.
_MISSED = re.compile(r"Ranks? ([\d, ]+) failed")


class HangMonitor:
    def __init__(self, topology: Topology, settings: HangSection, executor: Executor, *, state: RunState,
                 signals: SignalRecorder, kill_switch: KillSwitch | None, watch_interval_s: float) -> None:
        """``executor``: what the job does about a hang (:mod:`slurmrt.recovery`); ``state``: what the stop
        controller shares (the heartbeat and activity the watchdog reads, the agreement, and the nodes a requeue or
        in-job restart leaves out besides the suspects); ``kill_switch``: this node's poller (its first rank's);
        ``watch_interval_s``: the watcher's pace, which the census's default wait follows."""
        self.topology, self.settings, self.executor = topology, settings, executor
        self._watch_interval_s = watch_interval_s
        self._state = state
        self._signals = signals
        self._switch = kill_switch
        self._census: Census | None | bool = False  # False: not looked for yet
        self._response: HangResponse | None = None

    def watchdog(self, budget: Budget, phases: PhaseTimes) -> Watchdog:
        """The watchdog to poll on the watcher thread (over the run state's heartbeat and activity), and the
        response it calls when the run is hung."""
        s, state = self.settings, self._state
        census_wait_s = s.census_wait_s or max(10.0, 3 * self._watch_interval_s)
        self._response = HangResponse(
            self.topology, self.executor, kill_switch_seen=self.kill_switch_seen, last_step=self._last_step,
            census=self.census, census_wait_s=census_wait_s, also_exclude=lambda: list(state.exclude),
            terminating=lambda: signal.SIGTERM in self._signals.first_seen,
            cancel=functools.partial(cancel_and_exit, self._switch.path, self.topology.requeue_id)
            if self._switch is not None else None)
        watchdog = Watchdog(budget, phases, heartbeat=lambda: state.heartbeat, activity=lambda: state.activity,
                            on_hang=self._response.hung, floor_s=s.hang_floor_s, startup_s=s.startup_timeout_s,
                            fixed_s=s.hang_timeout_s, probe=self._probe)
        state.overdue = watchdog.overdue
        state.peers_ended = self._response.peers_ended
        return watchdog

    def _last_step(self) -> int | None:
        agreement = self._state.agreement
        return agreement.last_step if agreement is not None else None

    def kill_switch_seen(self) -> bool:
        """Seen by this rank's poller, or by any rank (through the agreed decision)."""
        if self._switch is not None and self._switch.seen is not None:
            return True
        agreement = self._state.agreement
        decision = agreement.decision if agreement is not None else None
        return decision is not None and Reason.KILL_SWITCH in decision.reasons

    def restart(self) -> None:
        """An in-process restart: the next census lives in the rebuilt default group's store."""
        self._census = False

    def census(self) -> Census | None:
        """This run's census, in the store of torch.distributed's default group; None for one process."""
        if self._census is False:
            self._census = None
            dist = torch_distributed()
            if self.topology.world_size > 1 and dist is not None and dist.is_available() and dist.is_initialized():
                try:
                    # A private API, and the only way to the rendezvous store torch already opened: a census in a
                    # collective would wait for the very rank that hangs.
                    store = dist.distributed_c10d._get_default_store()
                except Exception as err:  # noqa: BLE001 - without it, no census
                    logger.warning("no rendezvous store for the hang census: %s", err)
                    store = None
                if store is not None:
                    t = self.topology
                    self._census = Census(store, prefix=f"slurmrt/{t.requeue_id or 'local'}/{t.restart_count}/",
                                          rank=t.rank, world=t.world_size)
        return self._census if isinstance(self._census, Census) else None

    def node_of(self, rank: int) -> str | None:
        """The node ``rank`` registered in the census; None when unknown (no store, or it never registered)."""
        census = self.census()
        if census is None:
            return None
        try:
            return census.nodes([rank]).get(rank)
        except CensusError:
            return None

    def _probe(self, idle_s: float) -> None:
        """The training thread is stalled: did another rank find the job hung? Then answer its census, and exit. Did
        srun see a peer's task end (under ``slurmrt run``)? Then that peer is lost, or (stalled in a step) its answer
        is made: respond now."""
        census = self.census()
        try:
            opened = census is not None and census.is_open()
        except CensusError:
            opened = False  # the store's host is gone; else this rank's own watchdog acts when its allowance runs out
        if self._response is not None:
            if opened:
                self._response.joined(idle_s)
            activity = self._state.activity
            self._response.peer_ended(idle_s, in_step=activity is not None and activity.kind == "step")

    def uncaught(self, err: BaseException | None) -> None:
        """The program ends on ``err``: when it says a peer is gone, name the peer and requeue without its node."""
        if self._response is None or self.topology.world_size == 1 or err is None:
            return
        if is_peer_failure(err):
            self._response.lost_peer(err)
        self._response.crashed(err)

    def first_collective(self, group: Any) -> None:
        """slurmrt's groups were just opened (every rank at the same point): place this rank's node in the census,
        and with the health check, pass a barrier over every rank within the floor."""
        if self._response is not None and self.topology.world_size > 1:  # torch's excepthook is in place by now
            quiet_peer_tracebacks(stacks_file(self._response.executor.events.path, self.topology), is_peer_failure,
                                  logger.info)  # rank 0's says where; the leader names every rank's files
        census = self.census()
        if census is not None:
            try:
                census.register(self.topology.hostname)
            except CensusError as err:
                logger.warning("%s", err)
        if self.settings.health_check and group is not None:
            self._barrier(group, census)

    def _barrier(self, group: Any, census: Census | None) -> None:
        """A barrier over slurmrt's gloo group (it names the ranks that did not come), then an all-reduce over the
        training's own default group, whatever its backend: gloo proves the hosts reach each other, not that NCCL
        and the fabric under it (NVLink, InfiniBand) carry a collective. Each within ``hang_floor_s``."""
        import torch.distributed as dist

        floor = self.settings.hang_floor_s
        try:
            dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=floor), wait_all_ranks=True)
            backend_barrier(floor)
        except RuntimeError as err:
            found = _MISSED.search(str(err))
            ranks = [int(r) for r in re.findall(r"\d+", found.group(1))] if found else []
            nodes: list[str] = []
            if ranks and census is not None:
                with contextlib.suppress(CensusError):
                    nodes = sorted(set(census.nodes(ranks).values()))
            failures = [f"the start-up barrier did not complete in {floor:.0f} s: {err}"]
            if self.topology.rank == 0:
                unhealthy(self.executor, failures, nodes=nodes, node=self.topology.hostname)
            exit_now(ExitCode.UNHEALTHY)


def backend_barrier(timeout_s: float) -> None:
    """One all-reduce of a one-element tensor over the default process group (on this rank's GPU under NCCL),
    waited for at most ``timeout_s``; RuntimeError when it did not complete. Nothing without a default group."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    on_gpu = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()  # "nccl", or "cpu:gloo,cuda:nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    work = dist.all_reduce(torch.ones(1, device=device), async_op=True)
    if work is not None and not work.wait(timeout=datetime.timedelta(seconds=timeout_s)):
        raise RuntimeError(f"an all-reduce over the training's {dist.get_backend()} group did not complete in "
                           f"{timeout_s:.0f} s")
