"""What ran: the script, its content, its git commit, the command line and the versions, recorded by rank 0 in the
``init`` event of every run, so that a requeued run on an edited script (or a new torch) shows in ``slurmrt status``.

Read once at ``init()``, by rank 0 only: the script's bytes hashed (up to :data:`MAX_SCRIPT_BYTES`), ``git
rev-parse`` and ``git status`` in its directory (bounded in time; none where git or a repository is missing, as in
most containers), the versions from the installed packages' metadata (torch is not imported for it).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

__all__ = ["MAX_SCRIPT_BYTES", "changes", "what_ran"]

#: A script larger than this is not hashed (a data file given as the script?): its size and time stand in.
MAX_SCRIPT_BYTES = 16 << 20
_GIT_TIMEOUT_S = 5.0
_ARGV_CHARS = 4096
#: A repository's configuration runs no program of its own here (an fsmonitor hook would, at `git status`).
_SAFE = ("-c", "core.fsmonitor=false")


def what_ran(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The code of this process: ``script`` (its absolute path, or what ``argv[0]`` says when it is no file),
    ``sha256`` (its first 16 hex digits), ``git`` (``commit`` and ``dirty``, or None), ``argv`` (cut to 4 KiB) and
    the ``python``, ``torch`` and ``slurmrt`` versions."""
    argv = list(sys.argv if argv is None else argv)
    script = os.path.abspath(argv[0]) if argv and os.path.isfile(argv[0]) else (argv[0] if argv else "")
    said, left = [], _ARGV_CHARS
    for word in argv[:_ARGV_CHARS]:
        if left <= 0:
            break
        said.append(word[:left])
        left -= len(word)
    return {"script": script, "sha256": _digest(script), "git": _git(os.path.dirname(script) or "."),
            "argv": said, "python": platform.python_version(), "torch": _version("torch"),
            "slurmrt": _version("slurmrt")}


def _digest(path: str) -> str | None:
    """The first 16 hex digits of the file's SHA-256; None for no file, or one too large or unreadable."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_SCRIPT_BYTES:
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(MAX_SCRIPT_BYTES + 1)).hexdigest()[:16]
    except OSError:
        return None


def _git(directory: str) -> dict[str, Any] | None:
    """The commit checked out where the script is, and whether tracked files differ from it; None without git or a
    repository, or when git does not answer in time."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # a status that takes no lock another git could wait for
    try:
        head = subprocess.run(["git", "-C", directory, *_SAFE, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False, env=env)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", directory, *_SAFE, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.strip()
    return {"commit": commit[:40], "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """What differs between two runs' code, in words ("script train.py edited (3f2a... -> 9c1b...)", "torch 2.13.0
    -> 2.14.0"); nothing when either run did not record it."""
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return []
    said = []
    if before.get("script") != after.get("script"):
        said.append(f"script {before.get('script')} -> {after.get('script')}")
    elif before.get("sha256") != after.get("sha256"):
        said.append(f"{os.path.basename(str(after.get('script')))} edited ({before.get('sha256')} -> "
                    f"{after.get('sha256')})")
    said += _git_change(before.get("git") or {}, after.get("git") or {})
    if before.get("argv") != after.get("argv"):
        said.append("arguments changed")
    said += [f"{name} {before.get(name)} -> {after.get(name)}" for name in ("python", "torch", "slurmrt")
             if before.get(name) != after.get(name)]
    return said


def _git_change(old: Any, new: Any) -> list[str]:
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return []
    same = (old.get("commit"), old.get("dirty")) == (new.get("commit"), new.get("dirty"))
    return [] if same else [f"git {_commit(old)} -> {_commit(new)}"]


def _commit(git: Mapping[str, Any]) -> str:
    commit = str(git.get("commit") or "none")[:10]
    return commit + (" (dirty)" if git.get("dirty") else "")
