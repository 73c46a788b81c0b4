"""Checkpoints that are complete or absent, never half-written, and the same one on every rank.

Layout under the checkpoint directory::

    step_000001200/            complete checkpoints: visible only once every rank finished writing
        manifest.json          step, world size, kind, every file with its size; written last
        rank_00000.pt ...      one file per rank ("state" kind), or whatever a save callable wrote ("dir" kind)
    .tmp-step_000001300-...    a save in progress, or one killed by SIGKILL: never loaded, removed later
    latest                     name of the newest complete checkpoint, for people and tools

Commit: each rank writes and fsyncs its part in the temp directory; the ranks agree that all parts succeeded; rank 0
writes the manifest, fsyncs, renames the directory into place (atomic), fsyncs the parent, then updates ``latest``
by rename. A SIGKILL at any moment leaves either the old set or the new one. :meth:`CheckpointStore.load_latest`
scans the directories rather than trusting ``latest``, checks the manifest against the files, and the ranks agree on
the newest checkpoint that every one of them could read.
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _clock
from .._comm import Comm
from .._errors import CheckpointError
from ._files import fsync_dir, fsync_tree, replace_text, write_state, write_text

__all__ = ["CheckpointStore", "PendingSave", "SaveFn", "SaveResult"]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_(\d{9,})")
MANIFEST = "manifest.json"
SaveFn = Callable[[Path], Any]


@dataclass(frozen=True)
class SaveResult:
    step: int
    path: Path
    seconds: float
    bytes: int
    #: Wall time the save began.
    started: float


class PendingSave:
    """A save running on the ``slurmrt-save`` thread: its result (or error) is a value the caller takes with
    :meth:`wait`, on its own thread; nothing it learns is pushed anywhere."""

    def __init__(self, save: Callable[[], SaveResult]) -> None:
        self._save = save
        self._result: SaveResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slurmrt-save", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._save()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread by wait()
            self._error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> SaveResult:
        """Join the save; its result, or its error raised here. Calling it again gives the same answer."""
        self._thread.join()
        if self._error is not None:
            if isinstance(self._error, CheckpointError):
                raise self._error
            raise CheckpointError(f"background checkpoint save failed: {self._error!r}") from self._error
        assert self._result is not None
        return self._result


class CheckpointStore:
    def __init__(self, root: Path, comm: Comm, *, keep_last: int = 3, token: str = "0") -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest checkpoint (>= 1)")
        self.root = root
        self.comm = comm
        self.keep_last = keep_last
        self._token = token  # job id and restart: a temp dir name no earlier attempt used
        self._seq = 0
        #: The background save in flight, if any.
        self.pending: PendingSave | None = None

    # -- saving ----------------------------------------------------------------------------------------------------
    def save(self, state: dict[str, Any] | SaveFn, step: int, *, blocking: bool = True) -> SaveResult | PendingSave:
        """Write a checkpoint of ``step``; collective: every rank calls it with the same step.

        ``state`` is this rank's dict (tensors and plain data), or a callable that writes into the directory it is
        given (the same directory on every rank, as Accelerate's ``save_state`` and Megatron's saver expect).
        Blocking, it returns the :class:`SaveResult`. Non-blocking, tensors are copied to host memory now and
        written by a background thread, and it returns the :class:`PendingSave`; at most one is in flight, and the
        next save (or :meth:`wait`) waits for it.
        """
        self.wait()
        self._seq += 1
        tmp = self.root / f".tmp-step_{step:09d}-{self._token}-{self._seq}"
        if blocking:
            return self._save(state, step, tmp)
        snapshot = state if callable(state) else _to_host(state)
        self.pending = PendingSave(lambda: self._save(snapshot, step, tmp))
        return self.pending

    def wait(self) -> SaveResult | None:
        """Wait for the background save; raise its error here, on the calling (training) thread."""
        pending, self.pending = self.pending, None
        return pending.wait() if pending is not None else None

    def _save(self, state: dict[str, Any] | SaveFn, step: int, tmp: Path) -> SaveResult:
        start, started = _clock.mono(), _clock.wall()
        rank = self.comm.rank
        error: str | None = None
        files: dict[str, int] = {}
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            if callable(state):
                # Every rank of a framework saver writes into this one directory, and renames its own temporary
                # files there: a walk here could meet another rank's file as it vanishes (FileNotFoundError, seen
                # with Accelerate on the test cluster). Rank 0's commit syncs the whole tree once every rank is done.
                state(tmp)
            else:
                name = f"rank_{rank:05d}.pt"
                files = {name: write_state(tmp / name, state)}
        except Exception as err:  # disk full, permission denied, an unpicklable object: all ranks must hear of it
            # torch.save reports a failed write as "unexpected pos ...", hiding ENOSPC/EFBIG: show the free space.
            error = f"rank {rank}: {err!r} ({_free_space(self.root)}){_fix(err, self.root)}"
            logger.exception("checkpoint step %d: writing failed on rank %d: %s", step, rank, err)
        reports: list[tuple[str | None, dict[str, int]]] = self.comm.all_gather((error, files))  # one round trip
        errors = [e for e, _ in reports if e]
        if errors:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"checkpoint of step {step} failed, nothing was committed and the previous checkpoint is intact: "
                f"{'; '.join(errors)}. The traceback is in the failing rank's log",
                step=step, errors=errors,
            )
        all_files = [part for _, part in reports]
        final = self.root / f"step_{step:09d}"
        outcome: tuple[str | None, int] = (None, 0)
        if rank == 0:
            try:
                outcome = (None, self._commit(tmp, final, step, all_files, callable(state)))
            except Exception as err:
                logger.exception("checkpoint step %d: the commit failed", step)  # with the traceback
                outcome = (repr(err), 0)
                shutil.rmtree(tmp, ignore_errors=True)
        commit_error, size = self.comm.broadcast(outcome)
        if commit_error is not None:
            raise CheckpointError(
                f"checkpoint of step {step} could not be committed ({commit_error}); the previous one is intact",
                step=step,
            )
        return SaveResult(step=step, path=final, seconds=_clock.mono() - start, bytes=size, started=started)

    def _commit(self, tmp: Path, final: Path, step: int, all_files: list[dict[str, int]], is_dir: bool) -> int:
        """Make ``tmp`` the checkpoint ``final``; returns the bytes it holds. Rank 0 only."""
        files: dict[str, int] = {}
        if is_dir:
            files = fsync_tree(tmp)  # now that every rank finished writing into it
        else:
            for part in all_files:
                files.update(part)
        manifest = {"step": step, "world_size": self.comm.world_size, "kind": "dir" if is_dir else "state",
                    "files": files}
        write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        fsync_dir(tmp)
        if final.exists():
            # The same step saved twice (a periodic save, then the stop at that step): same training state.
            logger.info("checkpoint %s already exists; keeping it", final.name)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(self.root)
        replace_text(self.root / "latest", final.name + "\n")
        self._prune()
        return sum(files.values())

    def _prune(self) -> None:
        complete = self._complete_steps()
        for step in complete[self.keep_last:]:
            shutil.rmtree(self.root / f"step_{step:09d}", ignore_errors=True)
        for entry in self.root.glob(".tmp-step_*"):
            # Partial saves of earlier attempts (killed mid-save). The current attempt has none in flight: at most
            # one save runs at a time, and its directory was just renamed.
            shutil.rmtree(entry, ignore_errors=True)

    # -- loading ---------------------------------------------------------------------------------------------------
    def _complete_steps(self) -> list[int]:
        """Steps of directories that have a manifest, newest first (without reading the data)."""
        if not self.root.is_dir():
            return []
        steps = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.fullmatch(entry.name)
            if match and (entry / MANIFEST).is_file():
                steps.append(int(match.group(1)))
        return sorted(steps, reverse=True)

    def load_latest(self, *, load: bool = True) -> tuple[int, Any] | None:
        """(step, state) of the newest checkpoint every rank can read, the same on every rank; None if none.

        ``state`` is this rank's dict for the "state" kind, or the checkpoint's directory for the "dir" kind (for
        ``accelerator.load_state(path)`` and the like). Incomplete or corrupt checkpoints are skipped with a warning.
        """
        self.wait()
        candidates: list[int] = self.comm.broadcast(self._complete_steps() if self.comm.rank == 0 else None)
        for step in candidates:
            path = self.root / f"step_{step:09d}"
            value: Any = None
            problem: tuple[bool, str] | None = None  # (incompatible, message)
            try:
                value = self._read(path, load=load)
            except _Incompatible as err:
                problem = (True, str(err))
            except Exception as err:
                problem = (False, f"rank {self.comm.rank}: {err}")
            problems = [p for p in self.comm.all_gather(problem) if p]
            if not problems:
                return step, value
            incompatible = [message for fatal, message in problems if fatal]
            if incompatible:
                # Not damage: this run does not fit the checkpoint. Starting fresh would let pruning delete the
                # real progress after keep_last saves, so refuse on every rank.
                raise CheckpointError(incompatible[0], step=step)
            problems_text = [message for _, message in problems]
            if self.comm.rank == 0:
                logger.warning("checkpoint %s is unusable, trying an older one: %s", path, "; ".join(problems_text))
        return None

    def _read(self, path: Path, *, load: bool) -> Any:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        for name, size in manifest["files"].items():
            actual = (path / name).stat().st_size
            if actual != size:
                raise CheckpointError(f"{path / name} has {actual} bytes, the manifest says {size} (truncated?)")
        if manifest["kind"] == "dir":
            return path
        if manifest["world_size"] != self.comm.world_size:
            raise _Incompatible(
                f"{path} was written by {manifest['world_size']} ranks and this run has {self.comm.world_size}; "
                "per-rank state cannot be resharded. Run with the same world size, or save with a callable "
                "(a framework saver that reshards)",
            )
        file = path / f"rank_{self.comm.rank:05d}.pt"
        if not load:
            return file
        import torch

        with open(file, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=False)


class _Incompatible(Exception):
    """The checkpoint is sound but cannot be loaded by this run (another world size)."""


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def _fix(err: BaseException, root: Path) -> str:
    """The fix for the errors whose fix is known (a full disk, a refused write); nothing for the others -- a bug in
    a saver is not cured by freeing space. torch.save turns a full disk into "unexpected pos": that counts too."""
    if isinstance(err, OSError) and err.errno in _FULL or "unexpected pos" in str(err):
        return f"; fix: free space (or raise the quota) in {root}"
    if isinstance(err, OSError) and err.errno in _DENIED:
        return f"; fix: let the job write to {root} (permissions, a read-only mount)"
    return ""


def _free_space(path: Path) -> str:
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**30:.2f} GiB free in {path}"


def _to_host(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU: what the background writer sees cannot change under it."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return copy.deepcopy(obj)
