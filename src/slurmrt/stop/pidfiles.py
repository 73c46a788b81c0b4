"""Each training process registers its pid in a node-local directory per job, for `slurmrt signal`.

Launchers (torchrun, `accelerate launch`) die of SIGUSR1, so a `--signal=B:USR1` warning must be passed to the
training processes only; a command-line pattern (pkill -f) also matches the launcher, whose arguments name the script.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

__all__ = ["process_dir", "register_process", "unregister_process"]

logger = logging.getLogger(__name__)


def process_dir(job_id: str | None) -> Path:
    """Node-local directory where each training process of a job registers its pid (for `slurmrt signal`)."""
    return Path(tempfile.gettempdir()) / f"slurmrt-{os.getuid()}" / (job_id or "local")


def register_process(job_id: str | None) -> Path | None:
    """Register this process; returns the file to remove at close, None when the directory is unusable."""
    path = process_dir(job_id) / str(os.getpid())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as err:
        logger.warning("cannot register this process in %s (%s): `slurmrt signal` will not find it", path, err)
        return None
    return path


def unregister_process(path: Path | None) -> None:
    if path is None:
        return
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the last process of the job on this node removes the directory
        path.parent.rmdir()
