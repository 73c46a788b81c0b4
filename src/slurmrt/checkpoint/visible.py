"""What every node sees in a directory: one directory for every node, or one per node.

A checkpoint directory must be one directory for every node: a path that is node-local on some node (``/tmp``, a
local scratch, a mount only some nodes have) gives that node's ranks a directory of their own, their parts land
there, and rank 0 would commit a manifest naming files nobody can read. A local tier's directory must be the
opposite: a replica kept by a partner node protects nothing when both nodes write to the same disk.

:func:`survey` tells which, collectively, the first time a run uses the directory (its first save or load): the
first rank of each node writes a token named after its node into a directory of this survey's own, the ranks agree
that every token was written, then each node's first rank lists that directory once. Every rank learns the same
answer: for each node, the nodes whose tokens it did not see. What it asks of the filesystem: one file created and
removed per node, one directory listed per node (each listing of as many names as there are nodes): O(nodes)
metadata operations in all, once per run. What it sends: two gathers of a node name along the work group's tree and
two agreements, O(log N) hops each.

:func:`check_parts` is the commit's own check: before the manifest names a file, rank 0 checks that it sees it, at
the size its rank reported (one ``stat`` per file, on a few threads: O(files) metadata operations on one process,
about as many as the manifest has entries).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .._comm import Comm
from .._comm import problems as gather_problems
from .._errors import CheckpointError
from ._files import FileInfo

__all__ = ["PREFIX", "Survey", "check_parts", "require_parts", "survey"]

#: The survey's own directory, inside the surveyed one: ``.slurmrt-nodes-<token>-<random>``.
PREFIX = ".slurmrt-nodes-"
_NODE = re.compile(r"[A-Za-z0-9_.-]{1,255}")


@dataclass(frozen=True)
class Survey:
    """Every node of the run, and for each node that did not see them all, the nodes it did not see."""

    nodes: tuple[str, ...]
    unseen: dict[str, tuple[str, ...]]
    #: Why a node's first rank could not write or list its token (an OSError), by node.
    errors: dict[str, str]

    @property
    def one_directory(self) -> bool:
        """Every node saw every node's token: one directory for all of them."""
        return not self.unseen and not self.errors

    @property
    def shared_by(self) -> tuple[str, ...]:
        """The nodes that saw another node's token: those that share the directory with at least one other."""
        return tuple(n for n in self.nodes
                     if n not in self.errors and len(self.unseen.get(n, ())) < len(self.nodes) - 1)

    def apart(self) -> tuple[str, ...]:
        """The nodes that do not see the directory rank 0's node sees (the first node): where their parts would be
        lost."""
        first = self.nodes[0]
        return tuple(n for n in self.nodes if n in self.errors or first in self.unseen.get(n, ())
                     or n in self.unseen.get(first, ()))


def survey(directory: Path, comm: Comm, *, node: str, lead: bool, token: str) -> Survey:
    """Collective: which nodes see which nodes' tokens in ``directory`` (created if absent). ``lead``: this rank is
    the first of its node (one per node writes and lists); ``token`` names this run's attempt."""
    # Shape: a collective in its order (names, tokens written, listed, taken back); every rank reaches each round
    nodes, nonce = _plan(comm, node if lead else None)
    where = directory / f"{PREFIX}{token.replace('/', '_')}-{nonce}"
    error = _write_token(where, node, directory) if lead else None
    written = gather_problems(comm, error)  # also the barrier: every token is written before anyone lists
    listed = gather_problems(comm, _unseen(where, node, nodes) if lead and error is None else None)
    if lead:  # every node has listed (the agreement above): each takes its token back, the last one the directory
        with contextlib.suppress(OSError):
            (where / node).unlink()
        with contextlib.suppress(OSError):
            where.rmdir()
    failed = [*written, *(x for x in listed if isinstance(x, str))]
    return Survey(nodes, dict(x for x in listed if not isinstance(x, str)),
                  {e.split(":", 1)[0]: e for e in failed})


def _plan(comm: Comm, node: str | None) -> tuple[tuple[str, ...], str]:
    """Every node's name (each node's first rank gives its own), and a random part for the survey's directory: the
    same on every rank."""
    names = comm.gather(node)
    plan = comm.broadcast((sorted({n for n in names if n is not None}), secrets.token_hex(6))
                          if names is not None else None)
    return tuple(plan[0]), str(plan[1])


def _write_token(where: Path, node: str, directory: Path) -> str | None:
    """This node's token in the survey's directory; why not, in words."""
    if not _NODE.fullmatch(node) or node in {".", ".."}:
        return f"{node!r}: a node name that cannot name a file"
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / node).write_text(node + "\n")
    except OSError as err:
        return f"{node}: cannot write in {directory}: {err.strerror or err}"
    return None


def _unseen(where: Path, node: str, nodes: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | str | None:
    """(this node, the nodes whose tokens it does not see); None when it sees them all; why it cannot list."""
    try:
        seen = set(os.listdir(where))
    except OSError as err:
        return f"{node}: cannot list {where}: {err.strerror or err}"
    missing = tuple(n for n in nodes if n not in seen)
    return (node, missing) if missing else None


def check_parts(directory: Path, parts: Sequence[dict[str, FileInfo]], *, threads: int = 4) -> list[str]:
    """The files of each rank's part (by rank) that this process does not see in ``directory`` at the size the
    rank reported, in words ("rank 3: rank_00003.pt missing"); none when every file is there."""
    wanted = [(rank, name, int(info["size"])) for rank, part in enumerate(parts) for name, info in part.items()]

    def problem(item: tuple[int, str, int]) -> str | None:
        rank, name, size = item
        try:
            seen = os.stat(directory / name).st_size
        except OSError:
            return f"rank {rank}: {name} missing"
        return None if seen == size else f"rank {rank}: {name} has {seen} bytes, not {size}"

    if len(wanted) <= 1 or threads <= 1:
        found = [problem(w) for w in wanted]
    else:
        with ThreadPoolExecutor(min(threads, len(wanted)), thread_name_prefix="slurmrt-check") as pool:
            found = list(pool.map(problem, wanted))
    return [p for p in found if p is not None]


def require_parts(directory: Path, parts: Sequence[dict[str, FileInfo]], *, step: int, threads: int = 4) -> None:
    """:class:`~slurmrt.CheckpointError` unless this process sees every rank's files (:func:`check_parts`): rank 0,
    before it writes the manifest of ``step``."""
    unseen = check_parts(directory, parts, threads=threads)
    if unseen:
        raise CheckpointError(
            f"checkpoint of step {step}: rank 0 does not see {len(unseen)} file(s) other ranks wrote in {directory} "
            f"({'; '.join(unseen[:4])}{'; ...' if len(unseen) > 4 else ''}): the checkpoint directory is not one "
            "directory for every node (node-local on some?). Nothing was committed", step=step)
