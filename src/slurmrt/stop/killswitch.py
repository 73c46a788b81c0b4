"""The kill switch: a path anyone with write access can create to stop a job (or every task of an array) cleanly.

The watcher thread polls it (:meth:`KillSwitch.poll`); the agreement carries what it saw to every rank. It must work
when the job hangs too, which made kill switches useless elsewhere: the hang watchdog (:mod:`slurmrt.stop.watchdog`)
finds a training loop that no longer reaches a step boundary, and with the switch seen, :func:`cancel_and_exit`
cancels the job.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

from .. import _clock, _slurm

__all__ = ["KillSwitch", "cancel_and_exit"]

logger = logging.getLogger(__name__)


class KillSwitch:
    def __init__(self, path: Path) -> None:
        self.path = path
        #: Wall time the switch was first seen, or None. Read by the agreement.
        self.seen: float | None = None

    def poll(self) -> None:
        if self.seen is None and self.path.exists():
            self.seen = _clock.wall()
            logger.warning("kill switch %s exists: stopping at the next agreed step", self.path)


def cancel_and_exit(switch: Path, cancel_id: str | None, idle: float) -> NoReturn:
    """Cancel the job (array task) and exit this process with 0: the switch means "stop, no requeue", even when
    hung. No checkpoint: the training thread that would write it is the one that hangs."""
    import os

    logger.error(
        "kill switch %s seen, but the training loop has not reached a step boundary for %.0f s: it is hung. "
        "Cancelling %s and exiting without a checkpoint", switch, idle, cancel_id or "this process",
    )
    if cancel_id:
        out = _slurm.run("scancel", cancel_id)
        if isinstance(out, str):  # exit all the same: a hung process that stays helps no one
            logger.error("%s", out)
    os._exit(0)
