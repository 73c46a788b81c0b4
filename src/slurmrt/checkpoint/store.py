"""Checkpoints that are complete or absent, never half-written, and the same one on every rank.

Layout under the checkpoint directory::

    step_000001200/            complete checkpoints: visible only once every rank finished writing
        manifest.json          step, world size, kind, every file with its size and checksum; written last
        rank_00000.pt ...      one file per rank ("state" kind), or whatever a save callable wrote ("dir" kind),
        .metadata, __0_0.distcp ...  or a DCP checkpoint of sharded state ("dcp" kind), with
        local/rank_00000.pt    each rank's own state (RNG, data position) next to it
    .tmp-step_000001300-...    a save in progress, or one killed by SIGKILL, or a pruned checkpoint being deleted:
                               never loaded, removed by the next load_latest() or commit
    latest                     name of the newest complete checkpoint, for people and tools

Commit: each rank writes and fsyncs its part in the temp directory; the ranks agree that all parts succeeded; rank 0
writes the manifest, fsyncs, renames the directory into place (atomic), fsyncs the parent, then updates ``latest``
by rename. A SIGKILL at any moment leaves either the old set or the new one. :meth:`CheckpointStore.load_latest`
scans the directories rather than trusting ``latest``, checks the manifest against the files (sizes, and the
checksums, each rank a share of the files), and the ranks agree on the newest checkpoint that every one of them could
read.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import _clock
from .._comm import Comm
from .._comm import problems as gather_problems
from .._errors import CheckpointError
from . import sharded, staging
from ._files import (
    FileInfo,
    checksum_files,
    failure_advice,
    free_space,
    fsync_dir,
    fsync_tree,
    make_own_dir,
    replace_text,
    write_state,
    write_text,
)
from .background import NICE, PendingSave, SaveResult, Staged, run_below_training
from .helper import Helper
from .helper import available as helper_available
from .loading import Loaded, load_latest
from .manifest import MANIFEST, complete_steps, verify
from .parts import write_parts
from .retention import Retention
from .visible import require_parts

__all__ = ["CheckpointStore", "Loaded", "PendingSave", "SaveFn", "SaveResult", "Staged", "verify"]

logger = logging.getLogger(__name__)

SaveFn = Callable[[Path], Any]
#: A rank's part of a save: its kind of state, the files it wrote with their checksums, its DCP metadata (or None).
_Part = tuple[str, dict[str, FileInfo], Any]


class CheckpointStore:
    def __init__(self, root: Path, comm: Comm, *, keep_last: int = 3, keep_every: int | None = None,
                 token: str = "0", threads: int = 4, nice: int = NICE, process: bool = True,
                 guard: Callable[[], None] | None = None, trusted_gid: int | None = None) -> None:
        self.root = root
        #: Files of this group are loaded although another user wrote them (:mod:`.trust`).
        self.trusted_gid = trusted_gid
        self.comm = comm
        self.threads = threads
        #: How much below the training's priority a background save's write runs (see :mod:`.background`).
        self.nice = nice
        self._token = token  # job id and restart: a temp dir name no earlier attempt used
        self._seq = 0
        #: A random part of the temporary directories' names, agreed by the ranks at the first save: a name that
        #: nobody else can plant beforehand.
        self._nonce: str | None = None
        #: The save helper process that writes background saves (None: threads of this process write them).
        self.helper = Helper(nice) if process and helper_available() else None
        self._stager = staging.Stager(shared=self.helper.buffers if self.helper is not None else None)
        #: The background save in flight, if any.
        self.pending: PendingSave | None = None
        #: ``guard``: rank 0 calls it before it changes what is in the directory (commit, pruning, clearing
        #: leftovers); it raises when this job no longer holds the directory (:mod:`slurmrt.checkpoint.lease`).
        self.retention = Retention(root, keep_last=keep_last, keep_every=keep_every, guard=guard, nice=nice)
        self._committed: set[int] = set()  # steps this store committed: sound, written by this run

    # -- saving ----------------------------------------------------------------------------------------------------
    def save(self, state: dict[str, Any] | SaveFn | Staged, step: int, *, blocking: bool = True,
             local: Any = None) -> SaveResult | PendingSave:
        """Write a checkpoint of ``step``; collective: every rank calls it with the same step.

        ``state`` is one of:

        - a dict holding sharded tensors (DTensor: FSDP2, tensor parallel): saved with DCP, each shard once;
        - any other dict: this rank's state (a DDP model's), one ``torch.save`` file per rank;
        - a function writing into the directory it is given (the same directory on every rank, as Accelerate's
          ``save_state`` and Megatron's saver expect), or a :class:`Staged` one for a background save.

        ``local`` is this rank's own state (RNG states, a data loader's position), restored on the same rank.
        Blocking, it returns the :class:`SaveResult`. Non-blocking, the state is copied into reused host buffers
        now and written by a background thread, and it returns the :class:`PendingSave`; at most one is in flight,
        and the next save (or :meth:`wait`) waits for it.
        """
        if not blocking and callable(state) and not isinstance(state, Staged):
            raise CheckpointError(
                "a save function cannot run in the background: its own collectives (a framework saver's) would "
                "interleave with the training thread's. Save it with blocking=True, or pass "
                "slurmrt.Staged(snapshot, write): snapshot() on the training thread, write(snapshot, directory) "
                "in the background with no collective", step=step)
        taken, called = _clock.wall(), _clock.mono()  # the training is at ``step``: ``started``, whenever written
        self.wait()
        self._seq += 1
        if self._nonce is None:
            self._nonce = str(self.comm.broadcast(secrets.token_hex(8)))
        tmp = self.root / f".tmp-step_{step:09d}-{self._token}-{self._seq}{self._nonce}"
        work: dict[str, Any] | SaveFn
        if isinstance(state, Staged):  # its first part here, on the calling thread, blocking or not
            snap, write = state.snapshot(), state.write
            work = lambda d: write(snap, d)  # noqa: E731
        else:
            work = state
        if blocking:
            return replace(self._save(work, step, tmp, local, taken=taken), stall=_clock.mono() - called)
        if not callable(work):
            work = self._stager.stage(work)
        local = copy.deepcopy(local) if local is not None else None
        stall = _clock.mono() - called  # the training goes on now: the write is the background thread's
        self.pending = PendingSave(lambda: replace(self._save(work, step, tmp, local, background=True, taken=taken),
                                                   stall=stall))
        return self.pending

    def wait(self) -> SaveResult | None:
        """Wait for the background save; raise its error here, on the calling (training) thread."""
        pending, self.pending = self.pending, None
        return pending.wait() if pending is not None else None

    def close(self, timeout_s: float = 60.0) -> None:
        """Wait for the background save, then (at most ``timeout_s``) for the deletion of pruned checkpoints: the
        space they take is given back before the job ends. One that is not finished by then is out of sight, and
        the next run's pruning clears it."""
        try:
            self.wait()
        finally:
            if self.helper is not None:
                self.helper.close()
            self.retention.join_deletions(timeout_s)

    def _write(self, state: dict[str, Any] | SaveFn, tmp: Path, local: Any, helper: Helper | None = None) -> _Part:
        """This rank's part of the checkpoint: (kind, the files this rank wrote, with their checksums, and its DCP
        metadata for a sharded state, else None). ``helper``: the save helper process writes the tensors."""
        rank = self.comm.rank
        make_own_dir(tmp)
        files: dict[str, FileInfo] = {}
        metadata = None
        if callable(state):
            # Every rank of a framework saver writes into this one directory, and renames its own temporary
            # files there: a walk here could meet another rank's file as it vanishes (FileNotFoundError, seen
            # with Accelerate on the test cluster). Rank 0's commit checksums the whole tree once every rank is done.
            state(tmp)
            kind = "dir"
        elif sharded.is_sharded(state):
            files, metadata = sharded.save_dcp(state, tmp, rank=rank, world_size=self.comm.world_size,
                                               threads=self.threads, helper=helper)
            kind = "dcp"
        else:
            files = write_parts(tmp, f"rank_{rank:05d}.pt", state, threads=self.threads, helper=helper)
            kind = "state"
        if local is not None:
            (tmp / sharded.LOCAL_DIR).mkdir(exist_ok=True)
            name = f"{sharded.LOCAL_DIR}/rank_{rank:05d}.pt"
            files[name] = write_state(tmp / name, {"local": local})
        return kind, files, metadata

    def _save(self, state: dict[str, Any] | SaveFn, step: int, tmp: Path, local: Any = None, *,
              taken: float, background: bool = False) -> SaveResult:
        start, started = _clock.mono(), taken
        rank = self.comm.rank
        error: str | None = None
        part: _Part = ("state", {}, None)
        try:
            if background:  # below the training's CPU priority: it leaves the cores to the training loop
                part = run_below_training(lambda: self._write(state, tmp, local, self.helper), self.nice)
            else:
                part = self._write(state, tmp, local)
        except Exception as err:  # disk full, permission denied, an unpicklable object: all ranks must hear of it
            # torch.save reports a failed write as "unexpected pos ...", hiding ENOSPC/EFBIG: show the free space.
            error = f"rank {rank}: {err!r} ({free_space(self.root)}){failure_advice(err, self.root)}"
            logger.exception("checkpoint step %d: writing failed on rank %d: %s", step, rank, err)
        errors: list[str] = gather_problems(self.comm, error)  # one tree all_ok when every rank wrote its part
        if errors:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"checkpoint of step {step} failed, nothing was committed and the previous checkpoint is intact: "
                f"{'; '.join(errors)}. The traceback is in the failing rank's log",
                step=step, errors=errors,
            )
        # Every rank's files (and DCP metadata) to rank 0, for the manifest, along a tree: O(log N) hops, not a
        # ring's N - 1, and no rank connects to every other one.
        reports: list[_Part] | None = self.comm.gather(part)
        final = self.root / f"step_{step:09d}"
        outcome, committed = self._lead_commit(tmp, final, step, part[0], reports) if rank == 0 else ((None, 0), False)
        commit_error, size = self.comm.broadcast(outcome)
        if rank == 0 and committed:
            self._after_commit(final)  # after the broadcast: the other ranks do not wait for `latest` and pruning
        if commit_error is not None:
            raise CheckpointError(
                f"checkpoint of step {step} could not be committed ({commit_error}); the previous one is intact",
                step=step,
            )
        self._committed.add(step)
        self.retention.damaged.discard(step)
        return SaveResult(step=step, path=final, seconds=_clock.mono() - start, bytes=size, started=started,
                          kept=rank == 0 and not committed)

    def _lead_commit(self, tmp: Path, final: Path, step: int, kind: str, reports: list[_Part] | None
                     ) -> tuple[tuple[str | None, int], bool]:
        """Rank 0: the manifest from every rank's report, then the commit. ((the error or None, the bytes), whether
        it committed)."""
        assert reports is not None
        try:
            kinds = {k for k, _, _ in reports}
            if len(kinds) != 1:
                raise CheckpointError(f"the ranks saved different kinds of state ({sorted(kinds)}); every rank "
                                      "must pass the same kind", step=step)
            size = self._prepare(tmp, step, kind, [f for _, f, _ in reports], [m for _, _, m in reports])
            return (None, size), self._commit(tmp, final, step)
        except Exception as err:
            logger.exception("checkpoint step %d: the commit failed", step)  # with the traceback
            shutil.rmtree(tmp, ignore_errors=True)
            return (repr(err), 0), False

    def _prepare(self, tmp: Path, step: int, kind: str, parts: list[dict[str, FileInfo]],
                 metadata: list[Any]) -> int:
        """Write the manifest of ``tmp`` (and, for sharded state, DCP's ``.metadata`` merged from every rank's) and
        make the whole directory durable; returns the bytes it holds. Rank 0 only, before the commit point: a
        failure here leaves the previous checkpoints as they were."""
        files: dict[str, FileInfo] = {}
        for part in parts:
            files.update(part)
        if kind == "dcp":
            try:
                merged = sharded.merge_metadata(metadata)
            except CheckpointError as err:
                raise CheckpointError(f"checkpoint of step {step}: {err}", step=step) from err
            files[sharded.METADATA] = sharded.write_metadata(tmp, merged)
        require_parts(tmp, parts, step=step, threads=self.threads)  # a manifest never names a file rank 0 cannot see
        if kind == "dir":  # what the function wrote, now that every rank finished writing
            names = [n for n in fsync_tree(tmp) if n not in files]
            files.update(checksum_files(tmp, names, threads=self.threads))
        else:
            fsync_dir(tmp)
            if (tmp / sharded.LOCAL_DIR).is_dir():
                fsync_dir(tmp / sharded.LOCAL_DIR)
        if not files:
            raise CheckpointError(f"checkpoint of step {step}: the save wrote no file (a save function that wrote "
                                  "nothing?); an empty checkpoint would restore nothing", step=step)
        manifest = {"version": 2, "step": step, "world_size": self.comm.world_size, "kind": kind,
                    "files": dict(sorted(files.items()))}
        write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        fsync_dir(tmp)
        return sum(int(f["size"]) for f in files.values())

    def _commit(self, tmp: Path, final: Path, step: int) -> bool:
        """The commit point: ``tmp`` becomes ``final`` by rename. False when ``final`` is kept instead (this run
        committed that step already: a periodic save, then the stop at that step, hold the same training state).

        A ``final`` this run did not commit is replaced: it is an earlier run's, which load_latest found damaged
        or did not resume from, and the save in hand is sound. The damaged copy is renamed out of sight first; a
        SIGKILL between the two renames loses only that damaged copy (the new one waits in ``tmp``, and the older
        checkpoints are untouched)."""
        if self.retention.guard is not None:
            self.retention.guard()
        if final.exists() and step in self._committed:
            logger.info("checkpoint %s already exists (committed by this run); keeping it", final.name)
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        if final.exists():
            damaged = "it was found damaged" if step in self.retention.damaged else "an earlier run wrote it"
            logger.warning("checkpoint %s exists (%s): replacing it with this run's sound save", final.name, damaged)
            old = self.root / f".tmp-step_{step:09d}-{self._token}-{self._seq}-replaced"
            os.rename(final, old)
            os.rename(tmp, final)
            fsync_dir(self.root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
            fsync_dir(self.root)
        return True

    def _after_commit(self, final: Path) -> None:
        """What follows the commit point (``latest``, pruning): best effort. The checkpoint is committed and the
        next run loads it; an error here is logged, never reported as a failed save."""
        try:
            replace_text(self.root / "latest", final.name + "\n")
        except OSError as err:
            logger.warning("checkpoint %s is committed, but `latest` could not be updated (%s); it is only a hint "
                           "for people and tools: load_latest() finds the checkpoint without it", final.name, err)
        try:
            self.retention.prune(f"{self._token}-{self._seq}", own=self._token)
        except Exception:  # noqa: BLE001 - the save succeeded; pruning is retried at the next one
            logger.exception("pruning after %s failed; old checkpoints are kept until the next save", final.name)

    # -- loading ---------------------------------------------------------------------------------------------------
    def newest_step(self) -> int | None:
        """The newest step with a manifest (its files not checked): what a faster tier must match or beat."""
        steps = self._complete_steps()
        return steps[0] if steps else None

    def _complete_steps(self) -> list[int]:
        """Steps of directories that have a manifest, newest first (without reading the data)."""
        return complete_steps(self.root)

    def load_latest(self, *, into: dict[str, Any] | None = None, verify: bool = True) -> Loaded | None:
        """The newest checkpoint every rank can read, the same on every rank; None if none
        (:func:`.loading.load_latest`). A background save in flight is waited for first."""
        self.wait()
        return load_latest(self.root, self.comm, self.retention, trusted_gid=self.trusted_gid, into=into,
                           verify=verify)
