"""The node-local checkpoint tier: fast and frequent saves in node memory or on a node's NVMe, each rank's part also
kept by a partner node, so that losing any one node keeps every part.

Layout, on each node, under the configured directory (``/dev/shm``, ``$SLURM_TMPDIR``, an NVMe path)::

    slurmrt-<uid>/                 ours, 0700 (another user of the node can neither read nor plant anything)
      <key>/<node>/                <key>: the checkpoint directory's path, hashed (one training, whatever its job)
        step_000001200/
          rank_00003.pt            rank 3's part (its own, or the replica of its partner's)
          rank_00003.json          {step, rank, world_size, size, xxh3_64}: written last, the part's commit

A part is written to a temporary name, fsynced and renamed, and only then its ``.json``; a part without its
``.json``, or whose size or checksum differs from it, does not exist for :meth:`LocalTier.load`.

Partners: rank ``r`` sends its part to rank ``(r + L) % N`` (``L`` ranks per node, ``N`` in all): the same local
rank on the next node, which writes it as its node's replica. One node lost, each of its ranks' parts is on the next
node. Memory: ``keep`` steps x (the node's own parts + their replicas) = ``2 x keep x`` the node's share of a
checkpoint; older steps are deleted after each save.

:meth:`LocalTier.load` is collective: the ranks gather which parts each node holds, take the newest step whose every
part is held somewhere (and at least as new as the shared tier's ``floor``), read their own part where it is on their
node, receive it from a holder where not (a replacement node), verify every part's checksum, and agree. Anything
short of that returns None on every rank: the shared tier serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .. import _clock
from .._comm import Comm
from .._comm import problems as gather_problems
from .._errors import CheckpointError
from .._safefs import private_dir
from ._files import HASH, write_state
from ._localbytes import (
    as_tensor,
    checksum,
    checksum_int,
    checksum_str,
    close_mapped,
    deserialize,
    pairwise,
    write_file,
)
from .background import SaveResult
from .partners import choose, partner_of

__all__ = ["LocalTier", "tier_directory"]

logger = logging.getLogger(__name__)

_STEP = re.compile(r"step_(\d{9})")
_PART = re.compile(r"rank_(\d{5})\.json")


def tier_directory(base: Path, checkpoint_dir: Path, node: str) -> Path:
    """This node's directory of the tier for the training that checkpoints into ``checkpoint_dir``."""
    key = hashlib.sha256(str(checkpoint_dir.resolve()).encode()).hexdigest()[:16]
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,255}", node) or node in {".", ".."}:
        raise CheckpointError(f"node name {node!r} cannot name a directory")
    return base / f"slurmrt-{os.getuid()}" / key / node


class LocalTier:
    def __init__(self, base: Path, checkpoint_dir: Path, *, node: str, comm: Comm, per_node: int,
                 keep: int = 2) -> None:
        self.base = base
        self.directory = tier_directory(base, checkpoint_dir, node)
        self.comm = comm
        self.per_node = per_node
        self.keep = keep
        #: Rank 0, after :meth:`load`: the newest step the nodes held whole, however old (None: none). Whether the
        #: tier could have served the failure before the load, where the shared tier held a newer step.
        self.held: int | None = None

    def ready(self) -> Path:
        """The node's directory, made ours and private on the way (``base`` must exist: it is the node's)."""
        if not self.base.is_dir():
            raise CheckpointError(f"local checkpoint directory {self.base} does not exist on this node")
        top = private_dir(self.directory.parents[1])
        private_dir(top / self.directory.parent.name)
        return private_dir(self.directory)

    # -- saving ----------------------------------------------------------------------------------------------------
    def save(self, state: Any, step: int) -> SaveResult:
        """Write this rank's part and its partner's replica of ``step``; collective. Raises
        :class:`CheckpointError` (on every rank) when any rank failed: the tier then holds no ``step``."""
        # Shape: a collective: every rank reaches the exchange and the gather whatever failed before
        started, t0 = _clock.wall(), _clock.mono()
        rank, world = self.comm.rank, self.comm.world_size
        error: str | None = None
        directory: Path | None = None
        info: dict[str, Any] = {"size": 0, HASH: "0"}
        try:
            directory = self.ready() / f"step_{step:09d}"
            directory.mkdir(exist_ok=True)
            info = self._write_own(directory, rank, world, step, state)
        except Exception as err:  # every rank still takes part in the exchange below
            error = f"rank {rank}: {err}"
        partner = partner_of(rank, world, self.per_node)
        if partner is not None:
            source = (rank - self.per_node) % world
            own = directory / f"rank_{rank:05d}.pt" if error is None and directory is not None else None
            got, got_hash = self._exchange(own, info, partner, source)
            if error is None and directory is not None:
                try:
                    if got_hash is None or checksum(got) != got_hash:
                        raise CheckpointError(f"rank {source}'s replica did not arrive whole")
                    write_file(directory / f"rank_{source:05d}.pt", got)
                    self._commit(directory, source, world, step, {"size": len(got), HASH: got_hash})
                except Exception as err:
                    error = f"rank {rank} keeping rank {source}'s replica: {err}"
        problems = gather_problems(self.comm, error)
        if problems:
            raise CheckpointError(f"local checkpoint of step {step} failed: {'; '.join(problems)}", step=step)
        self._prune(step)
        took = _clock.mono() - t0  # always blocking: its whole time is the training's stall
        return SaveResult(step, self.directory / f"step_{step:09d}", took, int(info["size"]), started, stall=took)

    def _write_own(self, directory: Path, rank: int, world: int, step: int, state: Any) -> dict[str, Any]:
        """torch.save straight into the file, hashed as it is written (as the shared tier writes a part)."""
        path = directory / f"rank_{rank:05d}.pt"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            info = write_state(tmp, state)
            os.replace(tmp, path)
        except BaseException:  # a full tmpfs, an unpicklable object: no temporary file stays in the tier
            tmp.unlink(missing_ok=True)
            raise
        self._commit(directory, rank, world, step, info)
        return info

    def _commit(self, directory: Path, rank: int, world: int, step: int, info: dict[str, Any]) -> None:
        meta = {"step": step, "rank": rank, "world_size": world, "size": info["size"], HASH: info[HASH]}
        write_file(directory / f"rank_{rank:05d}.json", json.dumps(meta).encode())

    def _exchange(self, own: Path | None, info: dict[str, Any], partner: int, source: int
                  ) -> tuple[memoryview, str | None]:
        """Send this rank's part (mapped from its file, not copied) with its checksum to ``partner``, and receive
        ``source``'s (every rank does both at once). A rank whose own write failed sends nothing (size 0)."""
        import mmap

        import torch

        group = getattr(self.comm, "group", None)
        size = int(info["size"]) if own is not None else 0
        header = torch.tensor([size, checksum_int(info[HASH]) if own is not None else 0], dtype=torch.int64)
        got_header = torch.zeros(2, dtype=torch.int64)
        pairwise([(header, partner, True), (got_header, source, False)], group)
        got = torch.empty(int(got_header[0].item()), dtype=torch.uint8)
        with contextlib.ExitStack() as stack:
            out = torch.empty(0, dtype=torch.uint8)
            if size:
                assert own is not None
                f = stack.enter_context(open(own, "rb"))
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                stack.callback(close_mapped, mapped)
                out = as_tensor(memoryview(mapped))
            pairwise([(out, partner, True), (got, source, False)], group)
            del out
        if not got.numel():
            return memoryview(b""), None
        return got.numpy().data, checksum_str(int(got_header[1].item()))

    def _prune(self, newest: int) -> None:
        """Each rank deletes the older steps' files it wrote (its part, the replica it kept), beyond ``keep``."""
        mine = {self.comm.rank}
        partner = partner_of(self.comm.rank, self.comm.world_size, self.per_node)
        if partner is not None:
            mine.add((self.comm.rank - self.per_node) % self.comm.world_size)
        steps = sorted((s for s in self._steps() if s <= newest), reverse=True)
        for step in steps[self.keep:]:
            directory = self.directory / f"step_{step:09d}"
            for rank in mine:
                for suffix in (".json", ".pt"):  # the commit first: never a .json without its data
                    with contextlib.suppress(FileNotFoundError):
                        (directory / f"rank_{rank:05d}{suffix}").unlink()
            with contextlib.suppress(OSError):
                directory.rmdir()  # the last rank of the node to prune it

    def _steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return [int(m.group(1)) for p in self.directory.iterdir() if (m := _STEP.fullmatch(p.name))]

    def forget_after(self, step: int | None) -> None:
        """Delete this node's steps newer than ``step`` (None: all), which the run did not resume from: a later
        save of the same step must not be mixed with their parts."""
        for newer in self._steps():
            if step is None or newer > step:
                shutil.rmtree(self.directory / f"step_{newer:09d}", ignore_errors=True)

    def clear(self) -> None:
        """Remove this node's tier of the training (the run ended for good: nothing will resume from it)."""
        if self.comm.rank % self.per_node == 0 and self.directory.is_dir():
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- loading ---------------------------------------------------------------------------------------------------
    def holdings(self) -> dict[int, dict[int, dict[str, Any]]]:
        """step -> rank -> the part's meta, for every part this node holds whole (its ``.json`` and a file of that
        size; the checksum is checked when the part is read)."""
        held: dict[int, dict[int, dict[str, Any]]] = {}
        for step in self._steps():
            directory = self.directory / f"step_{step:09d}"
            for entry in directory.iterdir():
                m = _PART.fullmatch(entry.name)
                if m is None:
                    continue
                try:
                    meta = json.loads(entry.read_text())
                    data = directory / f"rank_{m.group(1)}.pt"
                    if meta.get("step") != step or meta.get("rank") != int(m.group(1)) or \
                            data.stat().st_size != meta.get("size") or not isinstance(meta.get(HASH), str):
                        continue
                except (OSError, ValueError, AttributeError):
                    continue
                held.setdefault(step, {})[int(m.group(1))] = meta
        return held

    def load(self, floor: int | None) -> tuple[int, Any, int] | None:
        """(step, this rank's state, bytes this rank received from another node) of the newest step ``>= floor``
        whose every part some node holds, the same on every rank; None when the tier cannot serve. Collective."""
        # Shape: a collective: gather, choose, fetch, verify, agree; every rank reaches each step whatever failed before
        rank, world = self.comm.rank, self.comm.world_size
        try:
            mine = self.holdings()
        except OSError as err:
            logger.warning("rank %d: local checkpoint tier %s unreadable: %s", rank, self.directory, err)
            mine = {}
        # Rank 0 chooses from every node's holdings and tells every rank (trees: O(log N) hops, not a ring).
        everyone: list[dict[int, dict[int, dict[str, Any]]]] | None = self.comm.gather(mine)
        plan = self.comm.broadcast(self._plan(everyone, floor))
        if plan is None:
            return None
        step, holder, metas = plan
        data, received, error = None, 0, None
        sends = [(r, metas[r]) for r in range(world) if holder[r] == rank and r != rank]
        try:
            data, received = self._gather_part(step, holder, metas, sends)
            if checksum(data) != metas[rank][HASH] or len(data) != metas[rank]["size"]:
                raise CheckpointError(f"rank {rank}'s part of step {step} does not match its checksum")
            state = deserialize(data)
        except Exception as err:
            error = f"rank {rank}: {err}"
            state = None
        problems = gather_problems(self.comm, error)
        if problems:
            if rank == 0:
                logger.warning("the local tier cannot serve step %d (%s): reading the shared tier", step,
                               "; ".join(problems))
            return None
        return step, state, received

    def _plan(self, everyone: list[dict[int, dict[int, dict[str, Any]]]] | None, floor: int | None
              ) -> tuple[int, list[int], list[dict[str, Any]]] | None:
        """Rank 0 (``everyone``: every rank's holdings): the step to load, ``>= floor``; :attr:`held` on the way."""
        whole = choose(everyone, self.comm.world_size, None) if everyone is not None else None
        self.held = whole[0] if whole is not None else None
        return whole if whole is not None and (floor is None or whole[0] >= floor) else None

    def _gather_part(self, step: int, holder: list[int], metas: list[dict[str, Any]],
                     sends: list[tuple[int, dict[str, Any]]]) -> tuple[bytes | memoryview, int]:
        """This rank's part: read here, or received from its holder; meanwhile send the parts this rank serves.
        Every send and receive is posted even when a read fails, so no peer waits forever."""
        import torch

        directory = self.directory / f"step_{step:09d}"
        rank = self.comm.rank
        ops: list[tuple[Any, int, bool]] = []
        for r, meta in sends:
            try:
                blob = (directory / f"rank_{r:05d}.pt").read_bytes()
            except OSError:
                blob = b""
            buf = torch.zeros(meta["size"], dtype=torch.uint8)
            if len(blob) == meta["size"] and blob:
                buf = as_tensor(memoryview(bytearray(blob)))
            ops.append((buf, r, True))
        incoming = None
        if holder[rank] != rank:
            incoming = torch.empty(metas[rank]["size"], dtype=torch.uint8)
            ops.append((incoming, holder[rank], False))
        if ops:
            pairwise(ops, getattr(self.comm, "group", None))
        if incoming is not None:
            return incoming.numpy().data, int(incoming.numel())
        return (directory / f"rank_{rank:05d}.pt").read_bytes(), 0
