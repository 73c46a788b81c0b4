"""Sharded state through ``torch.distributed.checkpoint`` (DCP): each shard written once by the rank that holds it,
resharded at load to however the new run shards the model; and the host snapshot a background save writes from.

slurmrt keeps its own commit around DCP (temporary directory, agreement, manifest, rename), so the directory that
becomes ``step_N`` is a plain DCP checkpoint: ``dcp.load(state, checkpoint_id=".../step_N")`` reads it without
slurmrt. DCP's collectives run on the group given here (slurmrt's work group, gloo), never on the training's.

Rank-local state (RNG states, a data loader's position) does not go through DCP: DCP takes plain tensors with the
same key on several ranks for replicas and writes one of them. It is written per rank under ``local/``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._files import FileInfo, Hashing, no_zip_crc

__all__ = ["Stager", "is_sharded", "load_dcp", "save_dcp"]

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


def save_dcp(state: dict[str, Any], directory: Path, *, group: Any, threads: int) -> dict[str, FileInfo]:
    """Write this rank's shards (and, on the coordinator, DCP's ``.metadata``) with ``threads`` writer threads;
    the files this rank wrote, with their checksums, hashed as DCP writes them. DCP writes each item with
    ``torch.save``, here without torch's zip CRC-32 of every record, as :func:`~._files.write_state` (the XXH3 of each
    file, in the manifest, is the check); ``dcp.load`` reads such files as any other."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True, thread_count=max(1, threads))
    fs = _hashing_file_system()()
    writer.fs = fs
    with no_zip_crc():
        dcp.save(state, storage_writer=writer, process_group=group)
    files = dict(fs.written)
    if ".metadata.tmp" in files:  # written under that name, then renamed
        files[".metadata"] = files.pop(".metadata.tmp")
    return files


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
            with super().create_stream(path, mode) as stream:
                hashing = Hashing(stream)
                yield hashing
            self.written[Path(path).name] = hashing.info()

    return HashingFileSystem




def load_dcp(into: dict[str, Any], directory: Path, *, group: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    dcp.load(into, storage_reader=FileSystemReader(directory), process_group=group)


class Stager:
    """Copies a state into host buffers kept from one save to the next (pinned when the tensor is on a GPU, so the
    copy runs at the link's speed and the next copy reuses them): the snapshot a background save writes while
    training changes the originals. Shardings survive: a DTensor's local shard is copied and wrapped again."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}
        self._devices: set[Any] = set()

    def stage(self, obj: Any) -> Any:
        import torch

        self._devices = set()
        out = self._stage(obj, (), _sharded_types())
        for device in self._devices:  # only where a tensor was: a synchronize elsewhere would create a CUDA context
            torch.cuda.synchronize(device)  # the non_blocking copies into pinned memory are done
        return out

    def _buffer(self, key: tuple[Any, ...], t: Any) -> Any:
        import torch

        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.stride() != t.stride():
            pin = t.device.type == "cuda"
            buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        if t.device.type == "cuda":
            self._devices.add(t.device)
        buf.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        return buf

    def _stage(self, obj: Any, key: tuple[Any, ...], sharded: tuple[type, ...]) -> Any:
        import torch

        dtensor = sys.modules.get("torch.distributed.tensor")
        if dtensor is not None and isinstance(obj, dtensor.DTensor):
            local = self._buffer(key, obj.to_local())
            return dtensor.DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False, shape=obj.shape,
                                      stride=obj.stride())
        if sharded and isinstance(obj, sharded):  # a ShardedTensor: the DTensors were handled above
            raise TypeError("a ShardedTensor (FSDP1's sharded state dict) cannot be saved in the background: "
                            "save it with blocking=True, or use FSDP2 (DTensor)")
        if isinstance(obj, torch.Tensor):
            return self._buffer(key, obj)
        if isinstance(obj, dict):
            return {k: self._stage(v, (*key, k), sharded) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._stage(v, (*key, i), sharded) for i, v in enumerate(obj))
        return copy.deepcopy(obj)
