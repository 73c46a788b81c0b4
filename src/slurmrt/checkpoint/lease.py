"""A checkpoint directory belongs to one live job at a time: a lease next to the checkpoints.

Two jobs on one directory destroy each other: each clears the other's saves in progress as leftovers, prunes the
other's checkpoints, and resumes from the other's weights. It happens for real: a job resubmitted while the old one
still runs, two array tasks given the same ``--checkpoint-dir``, a script's default path.

``.slurmrt-lease.json`` names the holder: the job (its requeue id: ``<array job>_<task>`` for an array task), the
host and pid of its rank 0, and a heartbeat that the watcher thread refreshes every ``REFRESH_S``. At ``init()``:

- no lease, or one of this job (a requeued run keeps its job id): the job takes it and goes on;
- one of another job that is still live: refused (:class:`~slurmrt.LeaseError`) before anything is written, naming
  the other job, where it runs, and the fix;
- one of another job that is stale, taken over with a warning. A lease is stale only on positive evidence that its
  holder is gone: its rank-0 process is gone from this host (pid and start time), its heartbeat is older than
  ``stale_s`` (``STALE_S``, 10 minutes, by default), or Slurm, asked on the holder's own cluster (``squeue -M``
  for another cluster),
  says its job ended *and* the heartbeat has stopped moving (``QUIET_S``). A holder alive on this host is never
  taken over. Slurm's "Invalid job id" alone is not evidence: a job of another cluster that shares the filesystem,
  or one whose record slurmctld already purged while its processes live, gets the same answer.

A job releases its lease when it closes, so the next task of an ``--array=...%1`` chain takes it at once; a task
killed by SIGKILL leaves it behind, and the next one takes it over once Slurm says the holder ended and its
heartbeat has been still for ``QUIET_S`` (the next task waits that long, at most, watching it). Rank 0 checks,
before every commit, pruning and clean-up, that it still holds the lease (:meth:`Lease.guard`): a job whose lease
was taken over while it stalled stops writing instead of deleting the new holder's files. Outside Slurm the holder
is the run (``local-<master address>:<port>``, or ``local-<host>-<pid>`` for one process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import _clock
from .._errors import CheckpointError, LeaseError, UnsafePathError
from .._safefs import locked_file, process_start_time, read_capped
from ..launch.topology import Topology
from ._files import replace_text
from .holder import Holder, slurm_job_alive
from .trust import check_directory

__all__ = ["LEADER_WAIT_S", "LEASE_FILE", "QUIET_S", "REFRESH_S", "STALE_S", "Holder", "Lease", "slurm_job_alive",
           "take"]

logger = logging.getLogger(__name__)

LEASE_FILE = ".slurmrt-lease.json"
_LOCK_FILE = ".slurmrt-lease.lock"
#: How often the holder's watcher rewrites its heartbeat.
REFRESH_S = 30.0
#: A heartbeat older than this makes a lease stale, whatever Slurm says (a cluster without squeue, a lost node).
STALE_S = 600.0
#: Slurm's "that job ended" counts only once the holder's heartbeat has not moved for this long: two refreshes
#: missed. A heartbeat that moves contradicts Slurm (another cluster's job, a purged record): the holder lives.
QUIET_S = 2 * REFRESH_S + 15.0
_LOCK_WAIT_S = 10.0
_MAX_BYTES = 64 << 10  #: a lease is a few hundred bytes
#: How long the other ranks wait for rank 0 to take over a lease they found live, before they refuse too (rank 0
#: may watch the heartbeat for QUIET_S first).
LEADER_WAIT_S = QUIET_S + 30.0

class Lease:
    def __init__(self, directory: Path, *, owner: str, job: str | None = None, array_task: str | None = None,
                 host: str | None = None, cluster: str | None = None, step: str | None = None,
                 run: str | None = None, stale_s: float = STALE_S,
                 quiet_s: float = QUIET_S, alive: Callable[[str, str | None], bool | None] = slurm_job_alive) -> None:
        self.directory = directory
        self.path = directory / LEASE_FILE
        self.owner = owner
        self._job, self._array_task = job, array_task
        self._host = host or socket.gethostname()
        self._cluster, self._step, self._run = cluster, step, run
        self._stale_s, self._quiet_s = stale_s, quiet_s
        self._alive = alive
        #: (owner, heartbeat) -> when this process first read that heartbeat (monotonic): how long it has been still.
        self._seen: dict[tuple[str, float], float] = {}
        self._next_refresh = 0.0
        self.held = False
        #: Set when another job took the lease over while this one held it: this job must not write any more.
        self.lost_to: Holder | None = None

    # -- reading ---------------------------------------------------------------------------------------------------
    def holder(self) -> Holder | None:
        """The holder named in the lease file; None when there is none (or it is damaged: a warning says so)."""
        try:
            raw = read_capped(self.path, _MAX_BYTES)
        except FileNotFoundError:
            return None
        except UnsafePathError as err:
            raise LeaseError(f"{err}. slurmrt writes its lease only as a file of its own", path=str(self.path)) \
                from None
        except OSError as err:
            raise LeaseError(f"cannot read the checkpoint directory's lease {self.path}: {err}",
                             path=str(self.path)) from None
        try:
            holder = Holder.parse(json.loads(raw))
        except (ValueError, RecursionError):
            holder = None
        if holder is None:
            logger.warning("%s is damaged (not a slurmrt lease): it is replaced", self.path)
        return holder

    def stale(self, holder: Holder) -> str | None:
        """Why ``holder`` (another owner's) no longer holds the directory, or None while it is live (or nothing
        proves it gone)."""
        now = _clock.wall()
        if now - holder.heartbeat > self._stale_s:
            return f"its heartbeat is {now - holder.heartbeat:.0f} s old (more than {self._stale_s:.0f} s)"
        if holder.host == self._host:
            if holder.start is None or process_start_time(holder.pid) != holder.start:
                return f"its process {holder.pid} is gone from {holder.host}"
            return None  # alive on this very host: whatever Slurm answers, it holds the directory
        if holder.owner == self.owner:  # another step of this very job, on another host: it writes, or it is gone
            if self._still_for(holder) >= self._quiet_s:
                return f"its heartbeat has not moved for {self._quiet_s:.0f} s"
            return None
        return self._ended_by_slurm(holder)

    def _ended_by_slurm(self, holder: Holder) -> str | None:
        """Another job's holder, on another host: gone when Slurm says its job ended and its heartbeat is still."""
        if not holder.job or self._still_for(holder) < self._quiet_s:
            return None
        if self._alive(holder.job, self._elsewhere(holder)) is not False:
            return None
        where = holder.cluster or self._cluster
        return (f"Slurm{f' (cluster {where})' if where else ''} says job {holder.job} has ended, and its heartbeat "
                f"has not moved for {self._quiet_s:.0f} s")

    def _elsewhere(self, holder: Holder) -> str | None:
        """The holder's cluster when it is not this one (``squeue -M`` needs slurmdbd, even for the own cluster:
        measured on the test cluster), else None: ask this cluster's squeue."""
        return holder.cluster if holder.cluster and holder.cluster != self._cluster else None

    def _still_for(self, holder: Holder) -> float:
        """How long the holder's heartbeat has not moved: by its own clock, or for as long as this process has
        watched it (clocks of two hosts may disagree; an unchanged value cannot)."""
        first = self._seen.setdefault((holder.owner, holder.heartbeat), time.monotonic())
        return max(_clock.wall() - holder.heartbeat, time.monotonic() - first)

    def _settle(self) -> None:
        """Before rank 0 decides: when only a still heartbeat stands between Slurm's "ended" and a takeover, watch
        the heartbeat for up to ``quiet_s``: if it moves the holder lives, if it does not it is gone."""
        holder = self.holder()
        if holder is None or not self._worth_watching(holder):
            return
        deadline = time.monotonic() + self._quiet_s + 1.0  # real time: a real wait for another host's process
        while time.monotonic() < deadline:
            time.sleep(min(1.0, self._quiet_s / 4))
            now = self.holder()
            if now is None or now != holder or self._still_for(now) >= self._quiet_s:
                return

    def _worth_watching(self, holder: Holder) -> bool:
        """Whether only a still heartbeat is missing to take ``holder`` over: another step of this job elsewhere,
        or another job on another host that Slurm says ended."""
        if self.mine(holder) or holder.host == self._host or not holder.job or self.stale(holder) is not None:
            return False
        return holder.owner == self.owner or self._alive(holder.job, self._elsewhere(holder)) is False

    def check(self, *, leader_wait_s: float = 0.0) -> Holder | None:
        """Refuse (:class:`~slurmrt.LeaseError`) when another live job holds the directory; the stale holder this
        job may take over, if any. Reads only: every rank calls it at init(), rank 0 then :meth:`acquire`.

        ``leader_wait_s`` (the other ranks): before refusing, wait that long for this job's rank 0 to take the
        lease over. Rank 0 decides; a rank that judged the holder live a moment before rank 0 judged it stale (its
        job just ended) must not leave rank 0 alone at the rendezvous."""
        holder = self.holder()
        if holder is None or self.mine(holder):
            return None
        judged = self._judged(holder, leader_wait_s)
        if judged is None:
            return None  # rank 0 took it over meanwhile
        holder, why = judged
        if why is None:
            raise self._refusal(holder)
        return holder

    def _judged(self, holder: Holder, leader_wait_s: float) -> tuple[Holder, str | None] | None:
        """(the holder, why it is stale or None while live), judged once and then, for up to ``leader_wait_s``,
        watched in the file only (Slurm is not asked again) for this job's rank 0 to take it over: None then."""
        why = self.stale(holder)
        deadline = time.monotonic() + leader_wait_s  # real time: a real wait for another process
        while why is None and time.monotonic() < deadline:
            time.sleep(0.5)
            now = self.holder()
            if now is None or self.mine(now):
                return None
            if (now.owner, now.step) != (holder.owner, holder.step):
                holder, why = now, self.stale(now)
        return holder, why

    def _refusal(self, holder: Holder) -> LeaseError:
        """The refusal for a live ``holder``: another step of this job, or another job."""
        if holder.owner == self.owner:
            return LeaseError(
                f"checkpoint directory {self.directory} is in use by {holder.describe(_clock.wall())}, another step "
                f"of this job (this is step {self._step}). Two steps on one directory destroy each other's "
                "checkpoints. Fix: run one training step at a time (`wait` for the first), or give each its own "
                f"checkpoint_dir. If that step is gone for good, remove {self.path}",
                directory=str(self.directory), holder=holder.owner, host=holder.host)
        return LeaseError(
            f"checkpoint directory {self.directory} is in use by {holder.describe(_clock.wall())}; this is "
            f"{'job ' if self._job else 'run '}{self.owner}. Two jobs on one directory destroy each other's "
            f"checkpoints. Fix: wait for {holder.owner} to end (or `scancel {holder.owner}`), or give this job "
            f"its own checkpoint_dir. If {holder.owner} is gone for good, remove {self.path}",
            directory=str(self.directory), holder=holder.owner, host=holder.host)

    def mine(self, holder: Holder) -> bool:
        """Whether ``holder`` is this job, not another step of it running beside it: the same owner, and an
        earlier run (requeued, or restarted in the job: that step ended) or this very step."""
        if holder.owner != self.owner:
            return False
        return holder.run != self._run or holder.step == self._step or None in (holder.step, self._step)

    # -- holding ---------------------------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease (rank 0, at init), under the directory's lock so that two jobs starting together cannot
        both win."""
        if self.directory.exists() and not self.directory.is_dir():
            raise LeaseError(f"checkpoint directory {self.directory} is a file, not a directory: give a directory "
                             "(it is created if absent), or move the file away", directory=str(self.directory))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._settle()
            with self._locked():
                taken = self.check()
                if taken is not None:
                    logger.warning("checkpoint directory %s: taking over the lease of %s, which is stale (%s)",
                                   self.directory, taken.describe(_clock.wall()), self.stale(taken))
                self._write()
        except OSError as err:
            raise LeaseError(f"cannot take the lease of checkpoint directory {self.directory}: {err}. The directory "
                             "must be writable by the job (and seen by every node)",
                             directory=str(self.directory)) from None
        self.held = True

    def refresh(self) -> None:
        """The watcher's poller: rewrite the heartbeat every REFRESH_S, and notice a lease taken over meanwhile."""
        if not self.held or self.lost_to is not None or _clock.mono() < self._next_refresh:
            return
        holder = self.holder()
        if holder is not None and not self.mine(holder):
            self.lost_to = holder
            logger.error("checkpoint directory %s was taken over by %s: this job writes no more checkpoints there",
                         self.directory, holder.describe(_clock.wall()))
            return
        self._write()

    def guard(self) -> None:
        """Raise :class:`~slurmrt.CheckpointError` unless this job still holds the directory: called by rank 0
        before it commits, prunes or clears leftovers (one small read)."""
        if not self.held:
            return
        holder = self.lost_to or self.holder()
        if holder is not None and not self.mine(holder):
            self.lost_to = holder
            raise CheckpointError(
                f"checkpoint directory {self.directory} now belongs to {holder.describe(_clock.wall())}: this job "
                "(whose lease went stale) must not commit or delete anything there. Nothing was changed",
                directory=str(self.directory), holder=holder.owner)

    def release(self) -> None:
        """Give the lease up at the end of the run, if it is still this job's."""
        if not self.held:
            return
        self.held = False
        with contextlib.suppress(OSError, LeaseError), self._locked():
            holder = self.holder()
            if holder is not None and holder.owner == self.owner and holder.pid == os.getpid():
                self.path.unlink()

    def _write(self) -> None:
        pid = os.getpid()
        record = Holder(owner=self.owner, host=self._host, pid=pid, start=process_start_time(pid),
                        heartbeat=_clock.wall(), job=self._job, array_task=self._array_task, uid=os.getuid(),
                        cluster=self._cluster, step=self._step, run=self._run)
        replace_text(self.path, json.dumps(asdict(record)) + "\n")
        self._next_refresh = _clock.mono() + REFRESH_S

    @contextlib.contextmanager
    def _locked(self) -> Any:
        path = self.directory / _LOCK_FILE
        try:
            with locked_file(path, timeout_s=_LOCK_WAIT_S):
                yield
        except TimeoutError:
            raise LeaseError(f"{path} stayed locked for {_LOCK_WAIT_S:.0f} s: another job is taking the checkpoint "
                             "directory, or a process holds the lock. Retry, or use another checkpoint_dir",
                             path=str(path)) from None
        except UnsafePathError as err:  # a link, a FIFO planted there
            raise LeaseError(f"cannot open the lease lock {path}: {err}", path=str(path)) from None

def take(directory: Path, topology: Topology, *, shared: bool = False) -> Lease:
    """The run's lease on its checkpoint directory: rank 0 takes it, the others check it, so that every rank of a
    job refused for another job's directory is refused at once, before any rendezvous. A directory that every user
    may write to is refused first, unless ``shared`` (:func:`.trust.check_directory`)."""
    check_directory(directory, shared=shared)
    t = topology
    owner = t.requeue_id or (f"local-{t.master_addr}:{t.master_port}" if t.world_size > 1
                             else f"local-{t.hostname}-{os.getpid()}")
    lease = Lease(directory, owner=owner, job=t.requeue_id, array_task=t.array_task_id, host=t.hostname,
                  cluster=t.cluster, step=t.step_id, run=f"{t.restart_count}.{t.attempt}")
    if t.rank == 0:
        lease.acquire()
    else:
        lease.check(leader_wait_s=LEADER_WAIT_S)
    return lease
