"""A background thread for the slow, occasional work: the kill-switch stat and the scheduler's end time.

Neither may sit on the per-step path: a ``stat`` per rank per step hammers a Lustre metadata server, and thousands of
ranks asking ``squeue`` gets a user banned from slurmctld. So one thread per node stats the kill switch every few
seconds, and one process per job asks for the end time at start and then rarely; the agreement carries both results
to every rank.

The thread also guards against the case that made kill switches useless: a hung job. If the switch is seen but the
training loop has not passed a step boundary for ``hang_timeout_s``, the step is hung (a dead peer, a stuck
collective); the watcher cancels this job (array task) and exits the process.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from . import _clock

__all__ = ["Watcher"]

logger = logging.getLogger(__name__)


class Watcher:
    def __init__(self, *, kill_switch: Path | None, poll_s: float, job_id: str | None, query_end_time: bool,
                 end_time_refresh_s: float, fetch_end_time: Callable[[str], float | None],
                 heartbeat: Callable[[], float], hang_timeout_s: float | None, cancel_id: str | None) -> None:
        self.kill_switch = kill_switch
        self.poll_s = poll_s
        self.job_id = job_id
        self._query_end = query_end_time and job_id is not None
        self._refresh_s = end_time_refresh_s
        self._fetch = fetch_end_time
        self._heartbeat = heartbeat
        self._hang_timeout_s = hang_timeout_s
        self._cancel_id = cancel_id
        #: Wall time the kill switch was first seen, or None. Read by the agreement.
        self.kill_seen: float | None = None
        #: Latest end time from the scheduler (epoch s), or None.
        self.end_time: float | None = None
        self.end_time_queries = 0
        self._next_end_query = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self.kill_switch is not None or self._query_end

    def start(self) -> None:
        if not self.active or self._thread is not None:
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
            try:
                self.poll_once()
            except Exception:  # never die silently: a dead watcher is a kill switch that does nothing
                logger.exception("slurmrt watcher iteration failed; retrying in %.1f s", self.poll_s)
            self._stop.wait(self.poll_s)

    def poll_once(self) -> None:
        """One iteration: stat the switch, refresh the end time when due, and check for a hang."""
        now = _clock.wall()
        if self.kill_switch is not None and self.kill_seen is None and self.kill_switch.exists():
            self.kill_seen = now
            logger.warning("kill switch %s exists: stopping at the next agreed step", self.kill_switch)
        if self._query_end and self.job_id is not None and _clock.mono() >= self._next_end_query:
            self._next_end_query = _clock.mono() + self._refresh_s
            self.end_time_queries += 1
            end = self._fetch(self.job_id)
            if end != self.end_time:
                logger.info("job %s ends at %s (epoch s)", self.job_id, end)
            self.end_time = end
        if self.kill_seen is not None and self._hang_timeout_s is not None:
            idle = _clock.mono() - self._heartbeat()
            if idle > self._hang_timeout_s and now - self.kill_seen > self._hang_timeout_s:
                self._give_up(idle)

    def _give_up(self, idle: float) -> None:
        logger.error(
            "kill switch %s seen, but the training loop has not reached a step boundary for %.0f s: it is hung. "
            "Cancelling %s and exiting without a checkpoint",
            self.kill_switch, idle, self._cancel_id or "this process",
        )
        scancel = shutil.which("scancel")
        if self._cancel_id and scancel:
            subprocess.run([scancel, self._cancel_id], check=False, timeout=30)
        os._exit(0)  # the switch means "stop and do not requeue": exit 0 even when hung
