"""Durable writes: a file, a directory entry or a whole tree is on disk (fsync) before the commit relies on it. And
the content checksum the manifest carries for every file (CRC-32, computed as the bytes are written where slurmrt
writes them, else read back while they are still in the page cache)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["FileInfo", "checksum_files", "crc32_file", "fsync_dir", "fsync_tree", "replace_text", "write_state",
           "write_text"]

#: name -> {"size": bytes, "crc32": "8 hex digits"}: one entry of a manifest's "files".
FileInfo = dict[str, Any]
_CHUNK = 16 << 20


class _Hashing:
    """A write-only file object that keeps the CRC-32 and the size of what went through it (torch.save writes to
    any object with ``write``)."""

    def __init__(self, f: Any) -> None:
        self._f, self.crc, self.size = f, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)  # releases the GIL for large buffers
        self.size += view.nbytes
        return self._f.write(view)

    def flush(self) -> None:
        self._f.flush()


def write_state(path: Path, state: dict[str, Any]) -> FileInfo:
    import torch

    with open(path, "wb") as f:
        out = _Hashing(f)
        torch.save(state, out)  # type: ignore[arg-type]  # any object with write()
        f.flush()
        os.fsync(f.fileno())
        return {"size": out.size, "crc32": f"{out.crc:08x}"}


def crc32_file(path: Path) -> FileInfo:
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return {"size": size, "crc32": f"{crc:08x}"}


def checksum_files(root: Path, names: Iterable[str], *, threads: int = 4) -> dict[str, FileInfo]:
    """The size and CRC-32 of each file, several files at a time (zlib releases the GIL)."""
    names = sorted(names)
    if len(names) <= 1 or threads <= 1:
        return {n: crc32_file(root / n) for n in names}
    with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="slurmrt-crc") as pool:
        return dict(zip(names, pool.map(lambda n: crc32_file(root / n), names), strict=True))


def write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def replace_text(path: Path, text: str) -> None:
    """Replace ``path`` whole, durably: a reader (or a run after a SIGKILL) sees the old text or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_text(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> list[str]:
    """fsync every file and directory under ``root``; the files' paths relative to it."""
    names: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath) / name
            with open(full, "rb") as f:
                os.fsync(f.fileno())
            names.append(str(full.relative_to(root)))
        fsync_dir(Path(dirpath))
    return names
