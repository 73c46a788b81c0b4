"""What the trainers' ``resume_from`` helpers share: the newest checkpoint, as the directory a framework wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["latest_directory"]


def latest_directory(rt: Any, *, framework: str, holds: str | None = None) -> Path | None:
    """The committed directory of the newest checkpoint, the same on every rank; None on a fresh start. Collective.

    A checkpoint that is not a directory the framework wrote (a state dict saved by ``rt.save``, or a directory
    without ``holds``) means the directory is shared with another kind of job: :class:`FileNotFoundError` says so.
    """
    got = rt.load_latest()
    if got is None:
        return None
    step, directory = got
    if not isinstance(directory, Path) or (holds is not None and not (directory / holds).is_file()):
        what = f"holds no {holds}" if holds is not None else "holds a state dict, not a directory"
        raise FileNotFoundError(f"the checkpoint of step {step} in {rt.options.checkpoint_dir} {what}: it was not "
                                f"written by {framework}; use a checkpoint directory of its own for {framework}")
    return directory
