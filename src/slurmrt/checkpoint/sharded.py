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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._files import FileInfo, Hashing

__all__ = ["Stager", "is_sharded", "load_dcp", "save_dcp"]

LOCAL_DIR = "local"


def _sharded_types() -> tuple[type, ...]:
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    from torch.distributed.tensor import DTensor

    types: list[type] = [DTensor]
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover - removed in some future torch
        pass
    else:
        types.append(ShardedTensor)
    return tuple(types)


def is_sharded(obj: Any) -> bool:
    """True if any leaf of ``obj`` is a DTensor (FSDP2, tensor parallel) or a ShardedTensor (FSDP1's sharded
    state dict), or a ``Stateful`` (DCP calls its ``state_dict``)."""
    types = _sharded_types()
    if not types:
        return False

    def walk(o: Any) -> bool:
        if isinstance(o, types):
            return True
        if hasattr(o, "state_dict") and hasattr(o, "load_state_dict") and not isinstance(o, dict):
            return True
        if isinstance(o, dict):
            return any(walk(v) for v in o.values())
        if isinstance(o, (list, tuple)):
            return any(walk(v) for v in o)
        return False

    return walk(obj)


def save_dcp(state: dict[str, Any], directory: Path, *, group: Any, threads: int) -> dict[str, FileInfo]:
    """Write this rank's shards (and, on the coordinator, DCP's ``.metadata``) with ``threads`` writer threads;
    the files this rank wrote, with their checksums, hashed as DCP writes them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True, thread_count=max(1, threads))
    fs = _hashing_file_system()()
    writer.fs = fs
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

    def stage(self, obj: Any) -> Any:
        import torch

        cuda = torch.cuda.is_available()
        out = self._stage(obj, (), _sharded_types())
        if cuda:
            torch.cuda.synchronize()  # the non_blocking copies into pinned memory are done
        return out

    def _buffer(self, key: tuple[Any, ...], t: Any) -> Any:
        import torch

        buf = self._buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.stride() != t.stride():
            pin = t.device.type == "cuda"
            buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        buf.copy_(t.detach(), non_blocking=t.device.type == "cuda")
        return buf

    def _stage(self, obj: Any, key: tuple[Any, ...], sharded: tuple[type, ...]) -> Any:
        import torch

        if sharded and isinstance(obj, sharded[0]):
            from torch.distributed.tensor import DTensor

            assert isinstance(obj, DTensor)
            local = self._buffer(key, obj.to_local())
            return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False, shape=obj.shape,
                                      stride=obj.stride())
        if sharded[1:] and isinstance(obj, sharded[1:]):
            raise TypeError("a ShardedTensor (FSDP1's sharded state dict) cannot be saved in the background: "
                            "save it with blocking=True, or use FSDP2 (DTensor)")
        if isinstance(obj, torch.Tensor):
            return self._buffer(key, obj)
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):  # a Stateful: DCP would call this
            return self._stage(obj.state_dict(), key, sharded)
        if isinstance(obj, dict):
            return {k: self._stage(v, (*key, k), sharded) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._stage(v, (*key, i), sharded) for i, v in enumerate(obj))
        return copy.deepcopy(obj)
