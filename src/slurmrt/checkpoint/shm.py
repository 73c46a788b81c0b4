"""Shared memory for the save helper: host buffers that are views of ``memfd`` segments, and the messages that carry
tensors to the helper as (segment, offset, dtype, shape, strides), never as bytes (:mod:`.helper`).

A segment's file descriptor goes to the helper once, over a Unix socket; a segment dies with the last process that
maps it, so a SIGKILL leaves nothing behind in ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import mmap
import os
import pickle
import socket
import struct
import sys
from typing import Any

__all__ = ["SharedBuffers"]

logger = logging.getLogger(__name__)

_ALIGN = 4096
_HEADER = struct.Struct("!Q")


class _Segment:
    """One block of shared memory: its file descriptor, its mapping, and its address in this process."""

    def __init__(self, ident: int, size: int, fd: int | None = None) -> None:
        self.ident, self.size = ident, size
        self.fd = os.memfd_create(f"slurmrt-stage-{ident}", os.MFD_CLOEXEC) if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, max(size, 1))
        self.map = mmap.mmap(self.fd, max(size, 1))
        import torch

        #: Where the mapping starts in this process (the tensors made over it keep it mapped).
        self.address: int = torch.frombuffer(self.map, dtype=torch.uint8, count=1).data_ptr()

    def storage(self, offset: int, nbytes: int, dtype: Any) -> Any:
        """A 1-D tensor of ``dtype`` over ``nbytes`` at ``offset``, with a storage of its own (``torch.save`` and
        DCP write a tensor's whole storage: one storage for the segment would write all of it for each tensor)."""
        import torch

        if nbytes == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):  # a view still exported: the mapping goes with it
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _storage_bytes(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))) * itemsize


class SharedBuffers:
    """Host buffers in shared memory, for the :class:`~.sharded.Stager`: :meth:`allocate` gives a new set (one
    segment), :meth:`locate` says where a tensor's bytes are."""

    def __init__(self) -> None:
        self.segments: dict[int, _Segment] = {}
        self._next = 0
        self._pinned: set[int] = set()

    def allocate(self, specs: list[tuple[tuple[int, ...], tuple[int, ...], Any]], *, pin: bool = False) -> list[Any]:
        """Empty tensors of these (shape, strides, dtype), in one new segment; the segments before are released
        (their buffers are no longer used: a new set replaces the whole old one)."""
        import torch

        for ident in list(self.segments):
            self.release(ident)
        offsets, size = [], 0
        for shape, stride, dtype in specs:
            offsets.append(size)
            size += -(-_storage_bytes(shape, stride, dtype.itemsize) // _ALIGN) * _ALIGN
        segment = _Segment(self._next, size)
        self._next += 1
        self.segments[segment.ident] = segment
        if pin and size:
            self._pin(segment)
        out = []
        for (shape, stride, dtype), offset in zip(specs, offsets, strict=True):
            nbytes = _storage_bytes(shape, stride, dtype.itemsize)
            out.append(torch.as_strided(segment.storage(offset, nbytes, dtype), shape, stride))
        return out

    def _pin(self, segment: _Segment) -> None:
        """Page-lock the segment for the GPU's copies, as ``pin_memory`` does for a buffer of its own; unpinned
        (slower copies, the same bytes) if CUDA refuses."""
        import torch

        try:
            code = torch.cuda.cudart().cudaHostRegister(segment.address, segment.size, 0)
        except Exception as err:  # noqa: BLE001 - no CUDA runtime: unpinned
            logger.warning("slurmrt: staging memory not pinned (%r): GPU-to-host copies will be slower", err)
            return
        if int(code) != 0:
            logger.warning("slurmrt: staging memory not pinned (cudaHostRegister: %s)", code)
            return
        self._pinned.add(segment.ident)

    def release(self, ident: int) -> None:
        segment = self.segments.pop(ident)
        if ident in self._pinned:
            import torch

            self._pinned.discard(ident)
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(segment.address)
        segment.close()

    def locate(self, tensor: Any) -> tuple[int, int, int] | None:
        """(segment, byte offset of the tensor's storage in it, the storage's bytes) for a tensor whose bytes are in
        one of the segments; None otherwise."""
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        for segment in self.segments.values():
            if segment.address <= address and address + nbytes <= segment.address + segment.size:
                return segment.ident, address - segment.address, nbytes
        return None

    def close(self) -> None:
        for ident in list(self.segments):
            self.release(ident)


class _Pickler(pickle.Pickler):
    """Pickles tensors whose bytes are in shared memory as where they are."""

    def __init__(self, file: Any, buffers: SharedBuffers) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.buffers = buffers

    def persistent_id(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or type(obj) not in (torch.Tensor, torch.nn.Parameter):
            return None
        if obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_quantized:
            return None
        where = self.buffers.locate(obj)
        if where is None:
            return None
        return ("shared", *where, obj.dtype, tuple(obj.shape), tuple(obj.stride()), obj.storage_offset())


class _Unpickler(pickle.Unpickler):
    """Rebuilds the tensors :class:`_Pickler` pickled as views of the segments; views of one storage share it."""

    def __init__(self, file: Any, segments: dict[int, _Segment]) -> None:
        super().__init__(file)
        self.segments = segments
        self.storages: dict[tuple[int, int, int, Any], Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        import torch

        kind, ident, offset, nbytes, dtype, shape, stride, storage_offset = pid
        if kind != "shared":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        key = (ident, offset, nbytes, dtype)
        base = self.storages.get(key)
        if base is None:
            base = self.storages[key] = self.segments[ident].storage(offset, nbytes, dtype)
        return torch.as_strided(base, shape, stride, storage_offset)


def _send(sock: socket.socket, message: Any, buffers: SharedBuffers | None = None) -> None:
    out = io.BytesIO()
    out.write(b"\0" * _HEADER.size)
    (_Pickler(out, buffers) if buffers is not None else pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)).dump(message)
    data = out.getbuffer()
    _HEADER.pack_into(data, 0, len(data) - _HEADER.size)
    sock.sendall(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return data


def _recv(sock: socket.socket, segments: dict[int, _Segment] | None = None) -> Any:
    (n,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return _Unpickler(io.BytesIO(_recv_exactly(sock, n)), segments or {}).load()
