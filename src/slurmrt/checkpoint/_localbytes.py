"""The local tier's bytes (:mod:`.local`): each part's checksum (as text in its ``.json``, as an int64 where it
travels in a tensor), a part's durable write, its reading back into a state, and the exchange's pairwise sends."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

from .._comm import wait_released


def checksum(data: bytes | memoryview) -> str:
    import xxhash

    return str(xxhash.xxh3_64_hexdigest(data))


def checksum_int(hexdigest: str) -> int:
    """The 16-hex-digit checksum as a signed int64 (it travels in a tensor)."""
    value = int(hexdigest, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def checksum_str(value: int) -> str:
    return f"{value & ((1 << 64) - 1):016x}"


def pairwise(ops: list[tuple[Any, int, bool]], group: Any) -> None:
    """Post every send and receive of ``ops`` ((tensor, peer, is_send)) at once, then wait for all of them."""
    import torch.distributed as dist

    works = [(dist.isend if send else dist.irecv)(t, peer, group=group) for t, peer, send in ops]
    for work in works:
        if work is not None:
            work.wait()
    del works, work  # the last one too: a live work object holds its tensor
    wait_released(*(t for t, _, _ in ops))  # gloo's worker no longer holds them: only Python owns them now


def as_tensor(data: memoryview) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given buffer is not writable": it is, or read only here
        return torch.frombuffer(data, dtype=torch.uint8)


def deserialize(data: bytes | memoryview) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def write_file(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def close_mapped(mapped: Any) -> None:
    """Close a mapped part; when a failed send still holds a view of it (its exception's traceback keeps the tensor),
    leave it to be unmapped with its last view, and let the send's own error (a lost partner) through."""
    with contextlib.suppress(BufferError):
        mapped.close()
