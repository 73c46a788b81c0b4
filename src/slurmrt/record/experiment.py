"""The experiment: one id for every run of a job, kept next to its checkpoints.

A job on Slurm is many runs (one after every preemption, time limit or node failure); its user sees one experiment.
The id lives in ``experiment.json`` in the checkpoint directory, so it follows the checkpoints: every requeued run,
and a job resubmitted by hand onto the same directory, continues the same experiment, and a fresh directory starts a
new one. The first process to get there creates the file with a hard link, which fails when the file exists
(atomic on local filesystems and on NFS), so every rank and every node reads back the one id that won, with no
collective and no lock.

Tracker ids that cannot be chosen in advance (MLflow's) are kept beside it in ``trackers.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from pathlib import Path
from typing import Any

from .. import _clock
from .._errors import ConfigError
from .._safefs import read_capped, replace_text, write_text

__all__ = ["EXPERIMENT_FILE", "TRACKERS_FILE", "establish", "read_trackers", "remember_tracker"]

logger = logging.getLogger(__name__)

EXPERIMENT_FILE = "experiment.json"
TRACKERS_FILE = "trackers.json"
#: Far more than slurmrt writes in either file: a larger one is refused, not read.
MAX_BYTES = 1 << 20

#: Letters, digits, '-', '_' and '.': what W&B, MLflow run names and file names all accept.
_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def new_id(job: str | None) -> str:
    """``<job>-<8 hex>`` (``4711_3-1a2b3c4d`` for an array task), or ``local-<8 hex>`` outside Slurm."""
    return f"{job or 'local'}-{uuid.uuid4().hex[:8]}"


def check_id(value: str) -> str:
    if not _VALID.fullmatch(value):
        raise ConfigError(
            f"experiment id {value!r}: use 1 to 64 letters, digits, '.', '-' or '_', starting with a letter or a "
            "digit (trackers and file names accept those)", value=value)
    return value


def establish(directory: Path | None, *, job: str | None, override: str | None = None) -> str:
    """The experiment id of the run: ``override`` if given, else the one stored in ``directory`` (created there
    when absent). Without a directory the id cannot outlive the process: a new one each call (there is no
    checkpoint to resume from either)."""
    if override is not None:
        check_id(override)
    if directory is None:
        return override or new_id(job)
    path = directory / EXPERIMENT_FILE
    stored = _read_id(path)
    if stored is None:
        stored = _create(path, override or new_id(job), job)
    if override is not None and override != stored:
        logger.warning("experiment id %s given, but %s holds %s: using %s for this run", override, path, stored,
                       override)
        return override
    return stored


def _read_id(path: Path) -> str | None:
    data = _read_json(path, "it holds the experiment id of this checkpoint directory; fix or remove it (a new id "
                            "starts a new experiment in the trackers)")
    if data is None:
        return None
    if not isinstance(data.get("id"), str):
        raise ConfigError(f"{path} has no experiment id (\"id\"): fix or remove it", path=path)
    return check_id(data["id"])


def _read_json(path: Path, fix: str) -> dict[str, Any] | None:
    """A JSON object, or None when the file does not exist; a clear error naming the file when it is damaged."""
    try:
        data = json.loads(read_capped(path, MAX_BYTES, own=True))  # a neighbour's id would join their runs
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} is unreadable ({err}): {fix}", path=path) from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object: {fix}", path=path)
    return data


def _create(path: Path, candidate: str, job: str | None) -> str:
    """Publish ``candidate`` unless another process got there first; return the id that won."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        record = {"id": candidate, "created": _clock.wall(), "job": job}
        write_text(tmp, json.dumps(record) + "\n")
        try:
            os.link(tmp, path)  # fails if it exists: the first process wins, on every node
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    except OSError as err:
        raise ConfigError(f"cannot create {path}: {err}. The checkpoint directory must be writable by the job "
                          "(and seen by every node)", path=path) from err
    won = _read_id(path)
    assert won is not None
    return won


def read_trackers(directory: Path) -> dict[str, Any]:
    return _read_json(directory / TRACKERS_FILE, "fix or remove it (the trackers then start new runs)") or {}


def remember_tracker(directory: Path, name: str, value: str) -> None:
    """Record a tracker's run id (atomic replace: a reader sees the old file or the new one)."""
    data = read_trackers(directory)
    data[name] = value
    replace_text(directory / TRACKERS_FILE, json.dumps(data, indent=1, sort_keys=True) + "\n")
