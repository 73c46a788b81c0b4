"""The kill switch: a path anyone with write access can create to stop a job (or every task of an array) cleanly.

The watcher thread polls it (:meth:`KillSwitch.poll`); the agreement carries what it saw to every rank. It must work
when the job hangs too, which made kill switches useless elsewhere: the hang watchdog (:mod:`slurmrt.hang.watchdog`)
finds a training loop that no longer reaches a step boundary, and with the switch seen, :func:`cancel_and_exit`
cancels the job.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NoReturn

from .. import _clock, _slurm, log
from .._errors import ConfigError

__all__ = ["KillSwitch", "cancel_and_exit", "exists"]

logger = logging.getLogger(__name__)


def _there(path: Path) -> bool:
    """``path`` exists (through links); PermissionError when a directory on the way may not be searched."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def exists(path: Path) -> bool:
    """Whether the kill switch is there, checked once at init(): a switch that can never be created is refused
    (:class:`ConfigError`), since a job that cannot be stopped is what the switch exists to prevent. That is an
    ancestor that is not a directory (a file, a dangling symlink), or a directory slurmrt may not look into. An
    ancestor that does not exist yet only earns a warning: it may be made later (``mkdir -p``, then ``touch``)."""
    try:
        if _there(path):
            return True
        for ancestor in path.parents:
            if os.path.lexists(ancestor):
                if not _there(ancestor) or not ancestor.is_dir():
                    what = "a dangling symlink" if ancestor.is_symlink() and not _there(ancestor) else \
                        "not a directory"
                    raise ConfigError(
                        f"kill switch {path} can never be created: {ancestor} is {what}. Give a path in a directory "
                        "(kill_switch= or SLURMRT_KILL_SWITCH)", path=str(path))
                break
    except PermissionError as err:
        raise ConfigError(f"kill switch {path} cannot be looked at ({err}): slurmrt could never see it. Give a path "
                          "the job may read, or fix the directory's permissions", path=str(path)) from None
    if not path.parent.is_dir():
        logger.warning("kill switch %s: its directory %s does not exist yet; create it before you touch the switch",
                       path, path.parent)
    return False


class KillSwitch:
    def __init__(self, path: Path) -> None:
        self.path = path
        #: Wall time the switch was first seen, or None. Read by the agreement.
        self.seen: float | None = None
        self._unreadable = False

    def poll(self) -> None:
        if self.seen is not None:
            return
        try:
            there = _there(self.path)
        except OSError as err:  # permissions changed mid-run: say it once, keep polling
            if not self._unreadable:
                self._unreadable = True
                logger.error("kill switch %s cannot be looked at (%s): it will be seen once it can", self.path, err)
            return
        if there:
            self.seen = _clock.wall()
            logger.warning("kill switch %s exists: stopping at the next agreed step", self.path)


def cancel_and_exit(switch: Path, cancel_id: str | None, idle: float) -> NoReturn:
    """Cancel the job (array task) and exit this process with 0: the switch means "stop, no requeue", even when
    hung. No checkpoint: the training thread that would write it is the one that hangs."""
    logger.error(
        "kill switch %s seen, but the training loop has not reached a step boundary for %.0f s: it is hung. "
        "Cancelling %s and exiting without a checkpoint", switch, idle, cancel_id or "this process",
    )
    if cancel_id:
        out = _slurm.run("scancel", cancel_id)
        if isinstance(out, str):  # exit all the same: a hung process that stays helps no one
            logger.error("%s", out)
    log.exit_now(0)
