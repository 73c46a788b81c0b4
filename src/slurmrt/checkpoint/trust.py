"""Whose files a job loads, and where it keeps them (OpenSSH's StrictModes is the model).

Loading a checkpoint unpickles it, and unpickling runs whatever code the file names: a checkpoint another user wrote
is a program that user runs as you. A checksum (XXH3) tells damage, not authorship. So:

- a checkpoint is loaded only when its directory, its manifest and every file it lists belong to this user (or to
  root), or carry a group the user trusts (``trusted_group=``: a file can only be given a group by a member of it);
  another's is skipped with a warning naming the file and its owner, and an older checkpoint of the user's is loaded;
- a checkpoint directory that other users may write to (mode ``o+w``) is refused at init(), before anything is
  written: they could replace, remove or plant files in it. A sticky one (``/scratch``-like, ``1777``) is warned
  about: others cannot touch the job's files there, but may still plant their own. Either is accepted, without a
  word, when the user says the directory is shared on purpose (``shared_checkpoint_dir=True``).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from .._errors import UnsafePathError

__all__ = ["check_directory", "foreign_files"]

logger = logging.getLogger(__name__)


def check_directory(directory: Path, *, shared: bool) -> None:
    """Refuse (:class:`~slurmrt.UnsafePathError`) a checkpoint directory that others may write to, unless
    ``shared``; warn about a sticky one. A directory that does not exist yet is created by the job, with its umask."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return
    if shared or not st.st_mode & stat.S_IWOTH:
        return
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if st.st_mode & stat.S_ISVTX:
        logger.warning("checkpoint directory %s (mode %s) is writable by every user: the sticky bit keeps them from "
                       "touching this job's files, but anyone may add their own, which slurmrt never loads. Give "
                       "the job a directory of its own (`mkdir -m 700`), or pass shared_checkpoint_dir=True to say "
                       "it is shared on purpose", directory, mode)
        return
    raise UnsafePathError(
        f"checkpoint directory {directory} has mode {mode}: every user may write to it, so anyone could remove "
        "this job's checkpoints, or replace them with their own. Fix: `chmod o-w {directory}` (or keep the "
        "checkpoints in a directory of your own); if it is shared on purpose, pass shared_checkpoint_dir=True "
        "(SLURMRT_SHARED_CHECKPOINT_DIR=1)", path=str(directory), mode=mode)


def foreign_files(directory: Path, names: Iterable[str], *, trusted_gid: int | None) -> list[str]:
    """What in ``directory`` (a checkpoint: itself and the files ``names``) belongs to another user, in words; a
    file that is missing is not this function's business (the manifest check names it)."""
    uid = os.getuid()
    problems = []
    for path in (directory, *(directory / n for n in names)):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid in (uid, 0) or (trusted_gid is not None and st.st_gid == trusted_gid):
            continue
        problems.append(f"{path} belongs to {_user(st.st_uid)}, not to this user: loading it would run what "
                        "they put in it. Not loaded (pass trusted_group=<their group> to trust the files of a "
                        "group you share)")
        if len(problems) >= 3:
            break
    return problems


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
