"""Sharded state through ``torch.distributed.checkpoint`` (DCP): each shard written once by the rank that holds it,
resharded at load to however the new run shards the model; and the host snapshot a background save writes from.

slurmrt keeps its own commit around DCP (temporary directory, agreement, manifest, rename), so the directory that
becomes ``step_N`` is a plain DCP checkpoint: ``dcp.load(state, checkpoint_id=".../step_N")`` reads it without
slurmrt.

No DCP collective runs. ``dcp.save`` plans centrally: every rank's plan is gathered to rank 0, which then holds a
connection to every rank and plans for all of them (16,384 sockets on one process at 16,384 ranks). Here each rank
plans and writes alone (``no_dist``): its files are named by its rank, as DCP's coordinator would name them
(``__3_0.distcp``), and its own metadata (its chunks, where each item lies in its files) goes to rank 0 with the
file list the manifest needs, over slurmrt's tree (O(log N) hops). Rank 0 merges them into the one ``.metadata``
(:func:`merge_metadata`) and checks that every tensor's chunks fill it exactly. Replicas, which DCP's coordinator
would write once, are written once by rule (:func:`writes_copy`): by one of their holders, chosen by a hash of the
item's name and offset that every rank computes alike, so that replicas spread over their holders. A load plans
alone too: each rank reads the merged ``.metadata`` and the chunks that overlap its own shards (``no_dist``), which
reshards to any world size.

Rank-local state (RNG states, a data loader's position) does not go through DCP: DCP takes plain tensors with the
same key on several ranks for replicas and writes one of them. It is written per rank under ``local/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import pickle
import sys
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from ._files import FileInfo, Hashing, no_zip_crc

__all__ = ["METADATA", "holder", "is_sharded", "load_dcp", "merge_metadata", "save_dcp",
           "write_metadata", "writes_copy"]

#: DCP's name for a checkpoint's metadata file.
METADATA = ".metadata"

LOCAL_DIR = "local"


def _sharded_types() -> tuple[type, ...]:
    """DTensor and ShardedTensor, if their modules are loaded: a state cannot hold one without them, and importing
    them costs seconds on a loaded machine (it once made the first save of a plain dict miss its deadline)."""
    types: list[type] = []
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and hasattr(dtensor, "DTensor"):
        types.append(dtensor.DTensor)
    sharded = sys.modules.get("torch.distributed._shard.sharded_tensor")
    if sharded is not None and hasattr(sharded, "ShardedTensor"):
        types.append(sharded.ShardedTensor)
    return tuple(types)


def is_sharded(obj: Any) -> bool:
    """True if any leaf of ``obj`` is a DTensor (FSDP2, tensor parallel) or a ShardedTensor (FSDP1's sharded
    state dict)."""
    types = _sharded_types()
    if not types:
        return False

    def walk(o: Any) -> bool:
        if isinstance(o, types):
            return True
        if isinstance(o, dict):
            return any(walk(v) for v in o.values())
        if isinstance(o, (list, tuple)):
            return any(walk(v) for v in o)
        return False

    return walk(obj)


def save_dcp(state: dict[str, Any], directory: Path, *, rank: int, world_size: int,
             threads: int, helper: Any = None) -> tuple[dict[str, FileInfo], Any]:
    """Write this rank's shards with ``threads`` writer threads, planned by this rank alone (see the module):
    (the files it wrote, with their checksums, hashed as DCP writes them; its DCP metadata, for
    :func:`merge_metadata` on rank 0). DCP writes each item with ``torch.save``, here without torch's zip CRC-32 of
    every record, as :func:`~._files.write_state` (the XXH3 of each file, in the manifest, is the check);
    ``dcp.load`` reads such files as any other. With a :class:`~.helper.Helper`, the planning is done here and the
    files are written by the helper process, from the items' data resolved here (the shared host buffers)."""
    import torch.distributed.checkpoint as dcp

    _quiet_planning_alone()
    use_helper = helper is not None and helper.ready()  # started by the first save that needs it; till then, threads
    while True:
        if use_helper:
            writer = _helper_writer()(directory, rank=rank, threads=threads, helper=helper)
        else:
            writer = _rank_writer()(directory, rank=rank, threads=threads)
        fs = _hashing_file_system()()
        writer.fs = fs
        try:
            dcp.save(state, storage_writer=writer, planner=_own_copies_planner()(rank, world_size), no_dist=True)
        except BaseException:  # DCP's CheckpointException derives from BaseException
            if not (use_helper and helper.lost):  # DCP wraps what its writer raised: the helper tells
                raise
            use_helper = False  # lost mid-write: threads write the same files over again
            continue
        return dict(fs.written), writer.metadata


def write_resolved(directory: Path, *, rank: int, threads: int, plan: Any,
                   data: list[Any]) -> tuple[list[Any], dict[str, FileInfo]]:
    """DCP's write of ``plan``'s items, each one's data given (``data``, in the plan's order), as the save helper
    runs it: (DCP's write results, the files with their checksums)."""
    writer = _rank_writer()(directory, rank=rank, threads=threads)
    fs = _hashing_file_system()()
    writer.fs = fs
    writer.set_up_storage_writer(False)
    resolved = {item.index: value for item, value in zip(plan.items, data, strict=True)}

    class Resolved:  # the one thing DCP's file writer asks its planner
        @staticmethod
        def resolve_data(item: Any) -> Any:
            return resolved[item.index]

    results = writer.write_data(plan, Resolved()).wait()
    return results, dict(fs.written)


def writes_copy(obj: Any, index: Any, rank: int, world_size: int) -> bool:
    """Whether this rank writes its copy of ``obj`` (its local shard, for a DTensor), the item ``index``
    (a ``MetadataIndex``), so that each replica is written once, by one of its holders: the holder :func:`holder`
    picks among a DTensor chunk's replicas (the ranks that differ from this one only on the mesh dimensions where it
    is replicated), or among all ranks for a plain tensor or another object, which DCP takes to be the same on every
    rank. A ShardedTensor's local shards are their owner's. The replicas spread over their holders, as DCP's
    coordinator spreads them (by bytes; here by a hash of their names)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(obj, dtensor.DTensor):
        mesh = obj.device_mesh
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            return False
        mine, holders = 0, 1
        for dim, placement in enumerate(obj.placements):
            if placement.is_replicate():
                mine, holders = mine * mesh.size(dim) + coordinate[dim], holders * mesh.size(dim)
        return mine == holder(index, holders)
    sharded = sys.modules.get("torch.distributed._shard.sharded_tensor")
    if sharded is not None and isinstance(obj, sharded.ShardedTensor):
        return True
    return rank == holder(index, world_size)


def holder(index: Any, holders: int) -> int:
    """Which of ``holders`` replicas of the item ``index`` writes it: the same answer on every rank (a CRC-32 of its
    name and offset; Python's ``hash`` of a string differs from one process to the next)."""
    offset = "" if index.offset is None else ",".join(str(int(o)) for o in index.offset)
    return zlib.crc32(f"{index.fqn}@{offset}".encode()) % holders


def merge_metadata(parts: list[Any]) -> Any:
    """The one DCP metadata of a checkpoint from every rank's own, in rank order: each tensor's chunks and where
    each item lies. A chunk that two ranks wrote is taken from the lower one. Raises :class:`CheckpointError` when a
    tensor's chunks do not fill it exactly (a rank's shards missing): such a checkpoint is never committed."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    merged: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    planner_data: dict[Any, Any] = {}
    for part in parts:
        for fqn, item in part.state_dict_metadata.items():
            _merge_item(merged, fqn, item, TensorStorageMetadata)
        for index, info in (part.storage_data or {}).items():
            storage.setdefault(index, info)
        planner_data.update(part.planner_data or {})
    for fqn, item in merged.items():
        if isinstance(item, TensorStorageMetadata):
            _check_filled(fqn, item)
    return dataclasses.replace(parts[0], state_dict_metadata=merged, storage_data=storage,
                               planner_data=planner_data or parts[0].planner_data)


def _merge_item(merged: dict[str, Any], fqn: str, item: Any, tensor_type: Any) -> None:
    """One rank's metadata of ``fqn`` into ``merged``: a tensor's chunks not seen yet are added."""
    have = merged.get(fqn)
    if have is None:
        merged[fqn] = dataclasses.replace(item, chunks=list(item.chunks)) if isinstance(item, tensor_type) else item
        return
    if not (isinstance(item, tensor_type) and isinstance(have, tensor_type)):
        return
    if have.size != item.size:
        raise CheckpointError(f"{fqn}: the ranks saved it with different shapes ({list(have.size)} and "
                              f"{list(item.size)})")
    seen = {tuple(c.offsets) for c in have.chunks}
    have.chunks.extend(c for c in item.chunks if tuple(c.offsets) not in seen)


def _check_filled(fqn: str, item: Any) -> None:
    have_volume = sum(math.prod(c.sizes) for c in item.chunks)
    if have_volume != math.prod(item.size):
        raise CheckpointError(f"{fqn}: the ranks' chunks hold {have_volume} of its {math.prod(item.size)} "
                              "elements; a checkpoint without all of a tensor is not committed")


def write_metadata(directory: Path, metadata: Any) -> FileInfo:
    """``directory/.metadata``, as DCP writes it (a pickle of the metadata), durably; its checksum."""
    with open(directory / METADATA, "wb") as f:
        out = Hashing(f)
        pickle.dump(metadata, out)
        f.flush()
        os.fsync(f.fileno())
    return out.info()


@functools.cache
def _quiet_planning_alone() -> None:
    # dcp.save and dcp.load with no_dist=True warn that they assume a single process; each rank plans alone on
    # purpose here. The filter is the process's, and matches only that message.
    warnings.filterwarnings("ignore", category=UserWarning, message=r"torch\.distributed is disabled, unavailable or "
                            r"uninitialized, assuming the intent is to (save|load) in a single process")


@functools.cache
def _rank_writer() -> type:
    """The class, made once torch is imported (``import slurmrt`` does not import torch)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StoragePrefix

    class RankWriter(FileSystemWriter):
        """DCP's file writer for a rank that plans alone: its files named by its rank, as DCP's coordinator names
        them, and its metadata kept (:attr:`metadata`) for rank 0's merge instead of written."""

        def __init__(self, path: Path, *, rank: int, threads: int) -> None:
            super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=max(1, threads))
            self.slurmrt_rank = rank
            self.metadata: Any = None

        def prepare_local_plan(self, plan: Any) -> Any:
            plan = super().prepare_local_plan(plan)
            return dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{self.slurmrt_rank}_"))

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            return plans  # each keeps its rank's prefix

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            # What FileSystemWriter.finish puts in the metadata before it writes it (rank 0 writes the merge).
            metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
            metadata.version = getattr(sys.modules[FileSystemWriter.__module__], "CURRENT_DCP_VERSION",
                                       metadata.version)
            metadata.storage_meta = self.storage_meta()
            self.metadata = metadata

    return RankWriter


@functools.cache
def _helper_writer() -> type:
    """The class, made once torch is imported."""
    from torch.futures import Future

    class HelperWriter(_rank_writer()):  # type: ignore[misc]
        """:class:`RankWriter` whose files the save helper writes: the data of each item of the plan is resolved
        here (views of the shared host buffers, DCP's pickled objects) and written there."""

        def __init__(self, path: Path, *, rank: int, threads: int, helper: Any) -> None:
            super().__init__(path, rank=rank, threads=threads)
            self.slurmrt_helper = helper

        def write_data(self, plan: Any, planner: Any) -> Any:
            data = [planner.resolve_data(item) for item in plan.items]
            results, written = self.slurmrt_helper.write_dcp(self.path, self.slurmrt_rank, self.thread_count, plan,
                                                             data)
            self.fs.written.update(written)
            done: Any = Future()
            done.set_result(results)
            return done

    return HelperWriter


@functools.cache
def _own_copies_planner() -> type:
    """The class, made once torch is imported."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    class OwnCopiesPlanner(DefaultSavePlanner):
        """DCP's default planner, less the copies another rank writes (:func:`writes_copy`)."""

        def __init__(self, rank: int, world_size: int) -> None:
            super().__init__()
            self.slurmrt_rank, self.slurmrt_world_size = rank, world_size

        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            items = [item for item in plan.items
                     if writes_copy(self.state_dict.get(item.index.fqn), item.index, self.slurmrt_rank,
                                    self.slurmrt_world_size)]
            self.plan = dataclasses.replace(plan, items=items)
            return self.plan

    return OwnCopiesPlanner


@functools.cache
def _hashing_file_system() -> type:
    """The class, made once torch is imported (``import slurmrt`` does not import torch)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        """DCP's local file system, hashing every file it writes as the bytes go by."""

        def __init__(self) -> None:
            super().__init__()
            self.written: dict[str, FileInfo] = {}

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
            if "w" not in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            # DCP's writer threads torch.save each item into this stream: torch's CRC option is per thread, so
            # it is turned off here, in the thread that writes the file.
            with super().create_stream(path, mode) as stream, no_zip_crc():
                hashing = Hashing(stream)
                yield hashing
            self.written[Path(path).name] = hashing.info()

    return HashingFileSystem




def load_dcp(into: dict[str, Any], directory: Path) -> None:
    """Load ``into`` in place from the DCP checkpoint at ``directory``, planned by this rank alone: the chunks that
    overlap its own shards, whatever world size wrote them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    _quiet_planning_alone()
    dcp.load(into, storage_reader=FileSystemReader(directory), no_dist=True)
