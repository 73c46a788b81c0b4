"""Retention: which committed checkpoints a directory keeps, and the removal of what is not a checkpoint.

The ``keep_last`` newest sound checkpoints are kept, every milestone (a step that is a multiple of ``keep_every``),
and the newest certified one (:mod:`slurmrt.health.rewind`), whatever its age: a run that saves damage it has not
found yet must not push out the last checkpoint known to be healthy. A checkpoint found damaged never counts as
kept, so damage cannot push the newest sound checkpoint out of the window. Deletion renames a checkpoint out of
sight before it unlinks a file: a SIGKILL in the middle of an ``rmtree`` once left a committed-looking directory
whose manifest outlived some of its files.

The renames are made at once, right after the commit; the files are unlinked by a background thread, off the save's
critical path (a blocking save, and every rank waiting for it, would otherwise wait for the deletion). What a
killed process leaves half-deleted is out of sight, and the next pruning clears it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .._safefs import remove_entry
from ._files import fsync_dir, leftover_tmp_files
from .background import NICE, lower_priority
from .manifest import complete_steps

__all__ = ["Retention"]

logger = logging.getLogger(__name__)


class Retention:
    def __init__(self, root: Path, *, keep_last: int, keep_every: int | None,
                 guard: Callable[[], None] | None = None, nice: int = NICE) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last}: keep at least the newest checkpoint (>= 1)")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every={keep_every}: a number of steps (>= 1), or None for no milestones")
        self.root, self.keep_last, self.keep_every = root, keep_last, keep_every
        self.nice = nice  # the deletions' priority below the training's: never urgent
        #: Raises when this job no longer holds the directory (:mod:`slurmrt.checkpoint.lease`): called before
        #: anything is deleted.
        self.guard = guard
        #: Steps found damaged (by a load): they never count as kept.
        self.damaged: set[int] = set()
        #: The newest certified step (the training's health check): never deleted. None: none.
        self.certified: int | None = None
        self._deleter: threading.Thread | None = None

    def prune(self, suffix: str, *, own: str) -> None:
        """Delete what :meth:`prunable` names; ``suffix`` makes the names of this attempt's deletions unique.
        Rank 0 only, right after a commit. The checkpoints are renamed out of sight before this returns; their files
        are unlinked in the background.

        ``own`` is this attempt's token: its temporary directories are never leftovers. Rank 0 prunes after the
        commit's broadcast, when the other ranks may already be writing the next save (a stop right after a
        periodic save) into a ``.tmp-step_*-<own>-*`` directory."""
        self.join_deletions()  # one deleter at a time: the leftovers below must not be another's work in progress
        doomed = [entry for entry in self._leftovers() if f"-{own}-" not in entry.name]
        renamed = 0
        for step in self.prunable(complete_steps(self.root)):
            target = self.root / f".tmp-step_{step:09d}-{suffix}-pruned"
            try:
                os.rename(self.root / f"step_{step:09d}", target)
            except OSError as err:  # the new checkpoint is committed: a failed pruning must not say otherwise
                logger.warning("checkpoint step_%09d could not be pruned, it is kept: %s", step, err)
                continue
            doomed.append(target)
            renamed += 1
        if renamed:
            fsync_dir(self.root)  # the renames are on disk before any file is unlinked
        if doomed:
            self._deleter = threading.Thread(target=_remove_below_training, args=(doomed, self.nice),
                                             name="slurmrt-prune", daemon=True)
            self._deleter.start()

    def deleting(self) -> bool:
        """True while pruned checkpoints are being deleted in the background."""
        deleter = self._deleter
        return deleter is not None and deleter.is_alive()

    def join_deletions(self, timeout_s: float | None = None) -> None:
        """Wait for the background deletion, if one runs (at most ``timeout_s``)."""
        deleter = self._deleter
        if deleter is not None:
            deleter.join(timeout_s)
            if not deleter.is_alive():
                self._deleter = None

    def prunable(self, complete: list[int]) -> list[int]:
        """The steps pruning deletes, of the committed ``complete`` (newest first)."""
        kept = 0
        doomed = []
        for step in complete:
            if step == self.certified:
                continue
            if kept < self.keep_last:
                kept += step not in self.damaged
                continue
            if self.keep_every is not None and step % self.keep_every == 0:
                continue
            doomed.append(step)
        return doomed

    def set_aside(self, newer_than: int, suffix: str) -> list[int]:
        """Rename the committed checkpoints after step ``newer_than`` out of sight, as ``.tainted-step_*``: a rewind
        went back before them, and no run may resume from them. Kept for a person to look at, never loaded, never
        deleted by pruning. Rank 0, only while this job holds the directory (the guard)."""
        if self.guard is not None:
            self.guard()
        moved = []
        for step in complete_steps(self.root):
            if step > newer_than:
                os.rename(self.root / f"step_{step:09d}", self.root / f".tainted-step_{step:09d}-{suffix}")
                moved.append(step)
        if moved:
            fsync_dir(self.root)
            logger.warning("checkpoint(s) after step %d set aside as %s/.tainted-step_*: the training was rewound "
                           "before them (%s)", newer_than, self.root, ", ".join(map(str, sorted(moved))))
        return moved

    def _leftovers(self) -> list[Path]:
        """The partial saves and interrupted deletions of earlier attempts, already out of sight, to delete with
        the pruned checkpoints; the temporary files of an interrupted ``latest`` update are removed at once. Checks
        that this job holds the directory first (the guard)."""
        if self.guard is not None:
            self.guard()
        for entry in leftover_tmp_files(self.root, "latest"):
            entry.unlink(missing_ok=True)
        return list(self.root.glob(".tmp-step_*"))

    def clear_leftovers(self) -> None:
        """Remove the partial saves and interrupted deletions of earlier attempts (killed by SIGKILL), and the
        temporary files of an interrupted ``latest`` update, now; rank 0 only, when none of this attempt's saves is
        in flight, and only while this job holds the directory (the guard)."""
        self.join_deletions()
        _remove(self._leftovers())


def _remove_below_training(entries: list[Path], nice: int) -> None:
    """The deleter thread: never urgent, it leaves the cores to training."""
    lower_priority(nice)
    _remove(entries)


def _remove(entries: list[Path]) -> None:
    for entry in entries:
        remove_entry(entry)  # never opens a FIFO planted under a leftover's name
