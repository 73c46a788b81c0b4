"""The checkpoint session of one run: its saves and loads, between the training loop and the store.

The store (:class:`~slurmrt.checkpoint.store.CheckpointStore`) knows the commit and load protocol; the session knows
the run: the store is made on the first save or load (on slurmrt's work group, with a temporary-directory token no
earlier attempt used, and the lease's guard), a stop's saves are blocking and skipped when SIGTERM left too little
time, a background save's result is taken when it is ready, and every save's time goes into the deadline's budget.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .. import _clock
from .._comm import Comm
from .._comm import problems as gather_problems
from .._errors import CheckpointError, ConfigError
from .._safefs import group_id
from ..stop.deadline import Budget
from ..stop.decision import StopDecision
from . import progress, visible
from .background import PendingSave, SaveResult, Staged
from .local import LocalTier
from .manifest import read_manifest
from .retention import Retention
from .settings import CheckpointSection
from .store import CheckpointStore, Loaded, SaveFn

__all__ = ["CheckpointSession", "Reports"]

logger = logging.getLogger(__name__)


class Reports(Protocol):
    """What a save or a load says in the log and the event log (:class:`~slurmrt.runtime.report.Reporter`)."""

    def saved(self, result: SaveResult, *, blocking: bool, tier: str = "shared") -> None: ...

    def save_skipped(self, step: int, save_s: float | None) -> None: ...

    def loaded(self, got: tuple[int, Any] | None, *, tier: str = "shared", from_peers: int | None = None,
               held: int | None = None, seconds: float | None = None) -> None: ...


class CheckpointSession:
    def __init__(self, settings: CheckpointSection, report: Reports, budget: Budget, *, token: str,
                 work: Callable[[], Comm], guard: Callable[[], None] | None = None, node: str = "local",
                 per_node: int = 1, lead: bool = True) -> None:
        """``token`` names this attempt's temporary directories (job id and restart); ``work`` opens slurmrt's
        work group on first use; ``guard`` raises when this job no longer holds the directory; ``node`` and
        ``per_node`` place this rank for the local tier's partners; ``lead``: the first rank of its node."""
        self.settings, self._report, self._budget = settings, report, budget
        self.directory = settings.checkpoint_dir
        self._token, self._work, self._guard = token, work, guard
        self._first_token = token
        self._node, self._per_node, self._lead = node, per_node, lead
        self._store: CheckpointStore | None = None
        self._local: LocalTier | None = None
        self._background: PendingSave | None = None
        #: The step of the checkpoint load_latest() resumed from; None before it, or on a fresh start.
        self.resumed_step: int | None = None
        #: This rank's ``local`` state of that checkpoint; None if none was saved, or if it could not be restored.
        self.local_state: Any = None
        self.loaded = False  #: True once load_latest() was called
        self._last_bytes: int | None = None  #: the last save's size: the next one's expected total
        self._writes: list[float] = []  #: the last shared saves' whole times (:meth:`writes`)
        self._certified: int | None = None  #: the newest certified step (the health check's): never pruned

    def _get_store(self) -> CheckpointStore:
        if self._store is None:
            if self.directory is None:
                raise ConfigError(
                    "save() and load_latest() need a checkpoint directory: pass slurmrt.init(checkpoint_dir=...) or "
                    "set SLURMRT_CHECKPOINT_DIR (a path every node sees)",
                )
            o = self.settings
            self._one_directory(self.directory)
            self._store = CheckpointStore(self.directory, self._work(), keep_last=o.keep_last,
                                          keep_every=o.keep_every, token=self._token, threads=o.save_threads,
                                          nice=o.save_nice, process=o.save_process,
                                          guard=self._guard, trusted_gid=group_id(o.trusted_group))
        self._store.retention.certified = self._certified
        self.settle()  # the store waits for a background save anyway; take its result first
        return self._store

    def _get_local(self) -> LocalTier | None:
        if self._local is None and self.settings.local_checkpoint_dir is not None and self.directory is not None:
            self._local = LocalTier(self.settings.local_checkpoint_dir, self.directory, node=self._node,
                                    comm=self._work(), per_node=self._per_node, keep=self.settings.local_keep)
            self._node_local(self._local)
        return self._local

    def _one_directory(self, directory: Path) -> None:
        """Before the first save or load: the checkpoint directory is one directory for every node, or every rank
        stops here with one line (:mod:`.misconfigured`, exit 78) that names the nodes and the fix."""
        seen = visible.survey(directory, self._work(), node=self._node, lead=self._lead, token=self._token)
        if seen.one_directory:
            return
        apart = seen.apart()
        why = [f"{', '.join(apart)} see(s) another directory at that path than {seen.nodes[0]} does (node-local "
               "there: /tmp, a local scratch, a mount only some nodes have)"] if apart else []
        why += seen.errors.values()
        error = ConfigError(f"checkpoint directory {directory} is not one directory for every node: {'; '.join(why)}. "
                            "Their parts of every checkpoint would be lost. Fix: a checkpoint_dir on the filesystem "
                            "every node mounts (the one your job's output goes to)")
        raise error

    def _node_local(self, tier: LocalTier) -> None:
        """The local tier's directory is each node's own: when nodes share it, the partner's replica protects
        nothing (both copies on one disk). Said once, by rank 0; the tier goes on."""
        try:
            where: Path | None = tier.ready().parent
        except (CheckpointError, OSError):
            where = None  # the tier's first save says why; the survey is collective all the same
        seen = visible.survey(where or tier.base, tier.comm, node=self._node, lead=self._lead and where is not None,
                              token=self._token)
        if seen.shared_by and tier.comm.rank == 0:
            logger.warning("local checkpoint directory %s is shared by nodes %s (a network filesystem?): a "
                           "partner's replica there protects nothing when a node is lost. Give a node-local path "
                           "(/dev/shm, a local NVMe)", tier.base, ", ".join(seen.shared_by))

    def save(self, state: dict[str, Any] | SaveFn | Staged, *, step: int, blocking: bool, local: Any,
             decision: StopDecision | None, tier: str = "shared") -> bool:
        """See :meth:`slurmrt.Runtime.save`; ``decision``: the agreed stop, if any (its saves are blocking)."""
        if decision is not None and not decision.save:
            self._report.save_skipped(step, self._budget.saves.estimate())
            return False
        if tier == "local":
            return self._save_local(state, step=step, local=local)
        store, blocking = self._get_store(), blocking or decision is not None
        with progress.reporting(f"saving step {step}", progress.saved_bytes(store.root, step), self._last_bytes,
                                enabled=blocking and store.comm.rank == 0):
            got = store.save(state, step, blocking=blocking, local=local)
        if isinstance(got, PendingSave):
            self._background = got
        else:
            self._saved(got, blocking=True, periodic=decision is None)
        return True

    def _save_local(self, state: Any, *, step: int, local: Any) -> bool:
        self._get_store()  # takes a background save's result first; checks the checkpoint directory
        tier = self._get_local()
        if tier is None:
            raise ConfigError("save(..., tier='local') needs a node-local directory: slurmrt.init("
                              "local_checkpoint_dir='/dev/shm') or SLURMRT_LOCAL_CHECKPOINT_DIR")
        if callable(state) or isinstance(state, Staged) or _sharded(state):
            raise ConfigError("the local tier keeps each rank's own state dict (what torch.save writes): a save "
                              "function or sharded (DTensor) state goes to the shared tier, save(..., tier='shared')")
        try:
            result = tier.save({"state": state, "local": local}, step)
        except CheckpointError as err:  # the same on every rank; the shared tier is the durable one
            if tier.comm.rank == 0:
                logger.warning("%s; the shared tier still holds the last durable checkpoint", err)
            return False
        self._report.saved(result, blocking=True, tier="local")
        return True

    def poll(self) -> None:
        """Take a finished background save's result (the per-step path: one attribute test while none is done)."""
        if self._background is not None and self._background.done():
            self.settle()

    def settle(self) -> None:
        """Take the background save's result, waiting for it if needed. Its error stays with the store, which
        raises it at its next call: the next save, load_latest() or finish()."""
        pending, self._background = self._background, None
        if pending is not None:
            with contextlib.suppress(CheckpointError):
                self._saved(pending.wait(), blocking=False, periodic=True)

    def wait(self) -> bool:
        """Wait for a background save, if any; False when it failed (logged here)."""
        if self._store is None:
            return True
        try:
            self._get_store().wait()
        except CheckpointError as err:
            logger.error("the last background checkpoint failed: %s", err)
            return False
        return True

    def close(self) -> None:
        """The run ends: wait for a background save (see :meth:`wait`), and for the deletion of pruned checkpoints."""
        self.wait()
        if self._store is not None:
            self._store.close()

    def restart(self, generation: int) -> None:
        """An in-process restart: forget the store and the local tier, which were made on the aborted work group,
        and the load; the next save or load makes them again, writing under a token of ``generation``'s own. A
        background save in flight fails with the groups (its files are never committed: the commit needs every
        rank)."""
        self._background, self._store, self._local = None, None, None
        self._token = f"{self._first_token}-p{generation}"
        self.resumed_step, self.local_state, self.loaded = None, None, False

    def writes(self) -> list[float]:
        """The whole times of this run's last shared saves, their writes behind the training included."""
        return list(self._writes)

    def _saved(self, result: SaveResult, *, blocking: bool, periodic: bool) -> None:
        self._last_bytes = result.bytes or self._last_bytes
        self._writes = [*self._writes[-2:], result.seconds]
        self._budget.save_done(result.seconds, started=result.started, periodic=periodic)
        self._report.saved(result, blocking=blocking)

    def keep_certified(self, step: int) -> None:
        """Checkpoint ``step`` is the newest certified one: retention never deletes it."""
        self._certified = step
        if self._store is not None:
            self._store.retention.certified = step

    def set_aside(self, newer_than: int) -> None:
        """Rank 0 alone (a rewind, from inside the failed step: nothing collective): the shared tier's checkpoints
        after ``newer_than`` out of sight, so that no later run resumes from them; a failure is said, and the
        rewind's load sets them aside again."""
        if self.directory is None:
            return
        retention = self._store.retention if self._store is not None else \
            Retention(self.directory, keep_last=1, keep_every=None, guard=self._guard)
        try:
            retention.set_aside(newer_than, self._token)
        except Exception as err:  # noqa: BLE001 - on rank 0 alone: the health error must stay the one every rank raises
            logger.warning("the checkpoints after step %d could not be set aside (%s): the rewind's load does it, "
                           "and loads none of them", newer_than, err)

    def from_lead(self, read: Callable[[], Any]) -> Any:
        """``read()`` on rank 0, heard by every rank (collective, on slurmrt's work group)."""
        comm = self._get_store().comm
        return comm.broadcast(read() if comm.rank == 0 else None)

    def load_latest(self, *, into: dict[str, Any] | None, verify: bool, rank: int,
                    below: int | None = None) -> Loaded | None:
        """The newest checkpoint, the local tier's when it can serve; ``below``: none after that step (a rewind's
        target: the ones after it are set aside first, on the shared tier and on every node's local one)."""
        # Shape: the local tier first where it can serve, then the shared; one report either way
        started = _clock.mono()
        store = self._get_store()
        tier = self._get_local()
        if below is not None:
            self._rewound(store, tier, below)
        asked = tier if into is None else None  # a load into given tensors reads the shared tier
        got, received = self._from_local(store, asked) if asked is not None else (None, 0)
        where = "local" if got is not None else "shared"
        if got is None:
            got = _load_shared(store, into=into, verify=verify)
        if tier is not None:
            tier.forget_after(got.step if got is not None else None)
        self._resumed(got, rank)
        total = store.comm.gather(received) if tier is not None else None  # rank 0 reports it
        self._said_loaded(got, where, tier, asked, total, started)
        return got

    def _said_loaded(self, got: Loaded | None, where: str, tier: LocalTier | None, asked: LocalTier | None,
                     total: list[int] | None, started: float) -> None:
        """The load's report: the tier read, the bytes from peers (with a local tier), whether the local tier held
        a whole checkpoint (when it was asked)."""
        self._report.loaded((got.step, got.state) if got is not None else None, tier=where,
                            from_peers=None if tier is None else sum(total or [0]),
                            held=asked.held if asked is not None else None, seconds=_clock.mono() - started)

    def _rewound(self, store: CheckpointStore, tier: LocalTier | None, below: int) -> None:
        """Before a rewind's load: nothing after step ``below`` on either tier (rank 0 sets the shared tier's aside;
        each node forgets its own). A set-aside that fails (a name planted where it renames to, the lease lost) stops
        every rank with the same error, never rank 0 alone in a collective: the load must not find a step after it."""
        problem = None
        if store.comm.rank == 0:
            try:
                store.retention.set_aside(below, self._token)
            except Exception as err:  # noqa: BLE001 - said on every rank below
                problem = f"{type(err).__name__}: {err}"
        found = gather_problems(store.comm, problem)
        if found:
            raise CheckpointError(f"the checkpoints after step {below} could not be set aside before the rewind's "
                                  f"load ({found[0]}): none is loaded. Move them out of {store.root}, and start "
                                  "again", step=below)
        if tier is not None:
            tier.forget_after(below)

    def _resumed(self, got: Loaded | None, rank: int) -> None:
        """What the run resumed from (None: a fresh start), as the Runtime's properties show it."""
        self.resumed_step = got.step if got is not None else None
        self.local_state = got.local if got is not None else None
        if got is not None and got.local_lost is not None:
            logger.warning("rank %d: %s", rank, got.local_lost)
        self.loaded = True

    @staticmethod
    def _from_local(store: CheckpointStore, tier: LocalTier) -> tuple[Loaded | None, int]:
        """The local tier's checkpoint when it holds the shared tier's newest step or a newer one, whole; and the
        bytes this rank received from other nodes. The shared tier's newest step is listed by rank 0 (no data
        read). An earlier attempt's partial saves go first, as in store.load_latest(): this run's saves must not
        find their temporary names taken."""
        if store.comm.rank == 0:
            store.retention.clear_leftovers()
        shared = store.comm.broadcast(store.newest_step() if store.comm.rank == 0 else None)
        here = tier.load(shared)
        if here is None:
            return None, 0
        step, blob, received = here
        return Loaded(step, blob["state"], blob["local"]), received

    def clear_local(self) -> None:
        """The run ended for good: nothing resumes from this node's local tier."""
        if self._local is not None:
            self._local.clear()


def _sharded(state: Any) -> bool:
    from ..checkpoint import sharded

    return isinstance(state, dict) and sharded.is_sharded(state)


def _checkpoint_bytes(root: Path, step: int | None) -> int | None:
    """The size of checkpoint ``step`` as its manifest says (for the load's progress); None when unknown."""
    if step is None:
        return None
    try:  # read_manifest checks the form: every entry has a whole size
        return sum(int(f["size"]) for f in read_manifest(root / f"step_{step:09d}")["files"].values())
    except CheckpointError:  # missing, damaged: load_latest() says so; the progress has no total
        return None


def _load_shared(store: CheckpointStore, *, into: dict[str, Any] | None, verify: bool) -> Loaded | None:
    """The shared tier's load, its progress said by rank 0 (its share: the newest checkpoint's size over the
    ranks)."""
    lead = store.comm.rank == 0
    newest = _checkpoint_bytes(store.root, store.newest_step()) if lead else None
    with progress.reporting("loading the latest checkpoint", progress.loaded_bytes() if lead else lambda: 0,
                            newest // store.comm.world_size if newest else None, enabled=lead):
        return store.load_latest(into=into, verify=verify)
