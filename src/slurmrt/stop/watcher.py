"""One background thread for the slow, occasional work: polling the kill switch, asking for the end time.

Neither may sit on the per-step path: a ``stat`` per rank per step hammers a Lustre metadata server, and thousands of
ranks asking ``squeue`` gets a user banned from slurmctld. The watcher calls its pollers every ``period_s``; an
iteration that raises is logged and retried, never fatal -- a dead watcher is a kill switch that does nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

__all__ = ["Watcher"]

logger = logging.getLogger(__name__)


class Watcher:
    def __init__(self, pollers: Sequence[Callable[[], None]], *, period_s: float) -> None:
        self.pollers = tuple(pollers)
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.pollers or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="slurmrt-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("slurmrt watcher did not stop within %.1f s", timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.period_s)

    def poll_once(self) -> None:
        """One iteration: every poller once, each failure logged on its own."""
        for poll in self.pollers:
            try:
                poll()
            except Exception:
                logger.exception("slurmrt watcher: %s failed; retrying in %.1f s", getattr(poll, "__qualname__", poll),
                                 self.period_s)
