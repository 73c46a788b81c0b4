"""A checkpoint's manifest, and the check of a checkpoint's files against it.

``manifest.json`` is written last, by rank 0, and says what the checkpoint is: its step, the world size that wrote
it, its kind, and every file with its size and checksum. A checkpoint is sound when its manifest is well formed
(:func:`manifest_problems`) and every file it lists has that size and checksum (:func:`check_files`). A manifest is
data from a shared directory: anything in it that is not what slurmrt writes is damage, never an exception.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from .._errors import CheckpointError
from .._safefs import read_capped
from ._files import HASH, checksum_files

__all__ = ["KINDS", "MANIFEST", "check_files", "complete_steps", "manifest_problems", "read_manifest", "step_dirs",
           "verify"]

MANIFEST = "manifest.json"
KINDS = ("state", "dir", "dcp")
#: A manifest names each file with its size and checksum: even a checkpoint of 100,000 files stays far below this.
MAX_MANIFEST_BYTES = 64 << 20
_STEP_DIR = re.compile(r"step_([0-9]{9,})")
_HEX = re.compile(r"[0-9a-f]{16}")


def _integer(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return f"a file name {name!r}"
    if name.startswith("/") or ".." in PurePosixPath(name).parts or "\\" in name or "\0" in name:
        return f"file name {name!r} points outside the checkpoint"
    return None


def _entry_problem(name: Any, entry: Any, version: int) -> str | None:
    named = _name_problem(name)
    if named is not None:
        return named
    if version == 1 and _integer(entry, 0):
        return None
    if not isinstance(entry, dict) or not _integer(entry.get("size"), 0):
        return f"{name}: {entry!r} is not a {{size, {HASH}}} entry"
    if version >= 2 and not (isinstance(entry.get(HASH), str) and _HEX.fullmatch(entry[HASH])):
        return f"{name}: checksum {entry.get(HASH)!r} is not 16 hex digits"
    return None


def manifest_problems(manifest: Any, directory: Path | None = None) -> list[str]:
    """What is wrong with a manifest as data (its files are not looked at): an empty list when it is one slurmrt
    wrote. ``directory``: the step directory it was read from, whose step it must name."""
    if not isinstance(manifest, dict):
        return [f"the manifest is a JSON {type(manifest).__name__}, not an object"]
    raw = manifest.get("version")
    version = raw if raw in (1, 2) and not isinstance(raw, bool) else None
    problems = [] if version is not None else [f"version {raw!r} (slurmrt writes 2)"]
    step, world, kind, files = (manifest.get(k) for k in ("step", "world_size", "kind", "files"))
    problems += _header_problems(step, world, kind, directory)
    return problems + _files_problems(files, kind, version or 2)


def _files_problems(files: Any, kind: Any, version: int) -> list[str]:
    """The map of files: each name and entry, and the file a kind cannot do without."""
    if not isinstance(files, dict) or not files:
        return ["it lists no file: a checkpoint that restores nothing" if isinstance(files, dict)
                else f"files {files!r} is not a map of file names"]
    problems = [p for p in (_entry_problem(n, e, version) for n, e in files.items()) if p]
    if kind == "dcp" and ".metadata" not in files:
        problems.append("a DCP checkpoint without .metadata")
    return problems


def _header_problems(step: Any, world: Any, kind: Any, directory: Path | None) -> list[str]:
    """The step (and the directory that must name it), the world size and the kind."""
    problems = []
    if not _integer(step, 0):
        problems.append(f"step {step!r} is not a step number")
    elif directory is not None:
        match = _STEP_DIR.fullmatch(directory.name)
        if match and int(match.group(1)) != step:
            problems.append(f"it names step {step}, but it is in {directory.name}")
    if not _integer(world, 1):
        problems.append(f"world_size {world!r} is not a number of ranks")
    if kind not in KINDS:
        problems.append(f"kind {kind!r} (one of {', '.join(KINDS)})")
    return problems


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the step directory ``directory``, once it is well formed; :class:`CheckpointError` naming the
    problem otherwise (missing, unreadable, not JSON, malformed)."""
    path = directory / MANIFEST
    try:
        # slurmrt writes it as a file: a link, a FIFO or a device in its place was put there by someone else
        manifest = json.loads(read_capped(path, MAX_MANIFEST_BYTES))
    except FileNotFoundError:
        raise CheckpointError(f"{directory} has no {MANIFEST}: not a committed checkpoint (a save in progress, or "
                              "one cut short)", path=str(directory)) from None
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path} cannot be read: {err}", path=str(path)) from None
    problems = manifest_problems(manifest, directory)
    if problems:
        raise CheckpointError(f"{path} is damaged: {'; '.join(problems)}", path=str(path))
    return manifest


def step_dirs(root: Path) -> list[int]:
    """Steps of every ``step_N`` directory under ``root``, newest first. Each became a ``step_N`` by the rename that
    commits it, with its manifest in it: one without a manifest is damaged, not a save in progress."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for m in (_STEP_DIR.fullmatch(e.name) for e in root.iterdir()) if m]
    return sorted(steps, reverse=True)


def complete_steps(root: Path) -> list[int]:
    """Steps of the directories under ``root`` that have a manifest, newest first (without reading the data)."""
    return [s for s in step_dirs(root) if (root / f"step_{s:09d}" / MANIFEST).is_file()]


def check_files(path: Path, manifest: dict[str, Any], *, checksums: list[str] | None = None,
                only: list[str] | None = None) -> list[str]:
    """What is wrong with the files of the checkpoint at ``path`` (its manifest well formed): a file missing, not a
    file, of another size, or (for the names in ``checksums``; None: all) of another checksum than the manifest
    says. ``only``: look at these files alone (None: every file). Manifests of version 1 carry sizes only."""
    entries: dict[str, Any] = manifest["files"]
    problems, present = _sizes(path, entries, set(entries) if only is None else set(only))
    wanted = [n for n in (present if checksums is None else [c for c in checksums if c in present])
              if isinstance(entries[n], dict) and HASH in entries[n]]
    return problems + _checksum_problems(path, entries, wanted)


def _checksum_problems(path: Path, entries: dict[str, Any], names: list[str]) -> list[str]:
    """The files among ``names`` (of the right size) whose checksum is not the manifest's."""
    try:
        sums = checksum_files(path, names)
    except OSError as err:
        return [f"{path}: a file cannot be read: {err}"]
    return [f"{path / name}: checksum {info[HASH]}, the manifest says {entries[name][HASH]} ({HASH}; the content "
            "changed after the save: a flipped bit, or an overwrite)" for name, info in sums.items()
            if info["size"] == int(entries[name]["size"]) and info[HASH] != entries[name][HASH]]


def _sizes(path: Path, entries: dict[str, Any], names: set[str]) -> tuple[list[str], list[str]]:
    """(what is wrong, the files of the right size) among ``names``."""
    problems, present = [], []
    for name, entry in entries.items():
        if name not in names:
            continue
        problem = _size_problem(path / name, entry if isinstance(entry, int) else int(entry["size"]))
        if problem is None:
            present.append(name)
        else:
            problems.append(problem)
    return problems, present


def _size_problem(file: Path, size: int) -> str | None:
    """What is wrong with ``file`` against the size its manifest gives (None: nothing)."""
    try:
        if file.is_symlink() or not file.is_file():
            return f"{file} is not a regular file" if file.exists() or file.is_symlink() else f"{file} is missing"
        actual = file.stat().st_size
    except OSError as err:
        return f"{file} cannot be read: {err}"
    return f"{file} has {actual} bytes, the manifest says {size} (truncated?)" if actual != size else None


def verify(path: Path) -> list[str]:
    """Check one committed checkpoint directory: its manifest, and every file's size and checksum against it (what
    ``slurmrt verify`` runs). An empty list: sound."""
    try:
        manifest = read_manifest(path)
    except CheckpointError as err:
        return [str(err)]
    return check_files(path, manifest)
