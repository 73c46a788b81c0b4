"""Loading the newest checkpoint every rank can read, the same one on every rank.

Rank 0 lists the complete checkpoints (their manifests), newest first, and clears what earlier saves left half-way;
for each candidate, every rank checks its share of the files against the manifest (sizes, and with ``verify`` the
checksums: the ranks together look at each file once), the ranks agree on what they found, and only then read it
(DCP's load is collective: a rank that skipped it would leave the others waiting). A damaged checkpoint is skipped
with a warning; one this run cannot load (another world size for per-rank state) is refused on every rank, since a
fresh start would let pruning delete the real progress.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._comm import Comm
from .._comm import problems as gather_problems
from .._errors import CheckpointError
from .manifest import MANIFEST, check_files, complete_steps, read_manifest
from .reader import Incompatible, read_local, read_rank_state, refuse_incompatible
from .retention import Retention
from .trust import foreign_files

__all__ = ["Loaded", "load_latest"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    step: int
    #: This rank's dict ("state"), the directory ("dir"), or the ``into`` dict filled in place ("dcp").
    state: Any
    #: This rank's local state (``save(..., local=...)``); None if none was saved or it could not be restored.
    local: Any = None
    #: Why the local state was not restored (another world size), else None.
    local_lost: str | None = None


def load_latest(root: Path, comm: Comm, retention: Retention, *, trusted_gid: int | None,
                into: dict[str, Any] | None = None, verify: bool = True) -> Loaded | None:
    """The newest checkpoint under ``root`` every rank can read, the same on every rank; None if none.

    Its ``state`` is this rank's dict for the "state" kind, the checkpoint's directory for the "dir" kind (for
    ``accelerator.load_state(path)`` and the like), or ``into`` loaded in place for the "dcp" kind (resharded to
    this run's sharding, whatever the world size that wrote it). Incomplete or corrupt checkpoints (a file whose size
    or, with ``verify``, checksum differs from the manifest's) are skipped with a warning; files another user wrote
    are refused unless their group is ``trusted_gid`` (:mod:`.trust`).
    """
    # Shape: newest first, each candidate checked then loaded on every rank; a misfit refuses, damage skips
    if comm.rank == 0:
        # Before the broadcast, so before any rank's next save: a run outside Slurm has the same token every time,
        # and its first save would otherwise write into an earlier attempt's half-written directory.
        retention.clear_leftovers()
    candidates: list[int] = comm.broadcast(complete_steps(root) if comm.rank == 0 else None)
    for step in candidates:
        path = root / f"step_{step:09d}"
        manifest, problems = _agreed(comm, _check, path, comm, trusted_gid=trusted_gid, verify=verify, into=into)
        value: Loaded | None = None
        if not problems:
            value, problems = _agreed(comm, _load, path, manifest, comm, into)
        if not problems:
            assert value is not None
            return value
        incompatible = [message for fatal, message in problems if fatal]
        if incompatible:
            # Not damage: this run does not fit the checkpoint. Starting fresh would let pruning delete the real
            # progress after keep_last saves, so refuse on every rank.
            raise CheckpointError(incompatible[0], step=step)
        retention.damaged.add(step)  # it never counts as kept, and a sound save of its step replaces it
        if comm.rank == 0:
            logger.warning("checkpoint %s is unusable, trying an older one: %s", path,
                           "; ".join(message for _, message in problems))
    return None


def _agreed(comm: Comm, work: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[tuple[bool, str]]]:
    """``work(*args, **kwargs)`` on this rank, then every rank's problem with it (one collective): its value (or
    None), and the problems as (incompatible, message)."""
    value, problem = None, None
    try:
        value = work(*args, **kwargs)
    except Incompatible as err:
        problem = (True, str(err))
    except Exception as err:
        problem = (False, f"rank {comm.rank}: {err}")
    return value, gather_problems(comm, problem)


def _load(path: Path, manifest: dict[str, Any], comm: Comm, into: dict[str, Any] | None) -> Loaded:
    state = read_rank_state(path, manifest, rank=comm.rank, into=into)
    local, lost = read_local(path, manifest, rank=comm.rank, world_size=comm.world_size)  # after it
    return Loaded(int(manifest["step"]), state, local, lost)


def _check(path: Path, comm: Comm, *, trusted_gid: int | None, verify: bool,
           into: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest, once this rank's share of the files matches it (every ``world_size``-th file: its size, and
    with ``verify`` its checksum; the ranks together look at each file once, and every rank hears of every problem
    through :func:`_agreed`), and this run can load it (raises :class:`~.reader.Incompatible` if not). A rank that
    looked at every file made a resume O(N²) metadata operations on the shared filesystem."""
    foreign = foreign_files(path, [MANIFEST], trusted_gid=trusted_gid)  # before a byte of it is read
    if foreign:
        raise CheckpointError("; ".join(foreign))
    manifest = read_manifest(path)
    names = sorted(manifest["files"])
    share = names[comm.rank::comm.world_size]
    problems = foreign_files(path, share, trusted_gid=trusted_gid) or \
        check_files(path, manifest, checksums=share if verify else [], only=share)
    if problems:
        raise CheckpointError("; ".join(problems))
    refuse_incompatible(path, manifest, world_size=comm.world_size, into=into)
    return manifest
