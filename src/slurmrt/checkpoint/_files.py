"""Durable writes: a file, a directory entry or a whole tree is on disk (fsync) before the commit relies on it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "fsync_tree", "replace_text", "write_state", "write_text"]


def write_state(path: Path, state: dict[str, Any]) -> int:
    import torch

    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


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


def fsync_tree(root: Path) -> dict[str, int]:
    files: dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = Path(dirpath) / name
            with open(full, "rb") as f:
                os.fsync(f.fileno())
            files[str(full.relative_to(root))] = full.stat().st_size
        fsync_dir(Path(dirpath))
    return files
