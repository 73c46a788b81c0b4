"""The NCCL side of the in-process restart: a peer blocked in a collective with the rank that raised learns of the
fault from the store and aborts its own communicator, instead of waiting for NCCL's watchdog (minutes).

Under gloo a rank that aborts closes its connections and its peers' collectives fail at once. NCCL waits on the GPU:
a peer blocked in an all-reduce with a rank that left it never sees a closed socket. So, for a backend other than
gloo, each rank keeps one thread per generation waiting in the store (server side: one pending request per rank, no
polling) for the generation's news: "fault", posted by the first rank that raised, or "done", posted by the first
rank whose ``train`` returned. On "fault", a rank whose training thread has not raised itself aborts its default
group: the blocked collective raises in the training thread, which takes the in-process restart's path like the rank
that raised. On "done" the thread ends.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DONE", "FAULT", "PeerAbort"]

logger = logging.getLogger(__name__)

FAULT = "fault"
DONE = "done"
#: How long one wait in the store lasts before the thread asks again (a generation may run for days).
WAIT_S = 60.0


class PeerAbort:
    """One generation's watcher: :meth:`start` it with the group made, :meth:`raised` from the training thread's
    handler before it aborts the group itself, :meth:`tell` the news, :meth:`close` at the generation's end."""

    def __init__(self, store: Any, key: str, abort: Callable[[], None], *, wait_s: float = WAIT_S) -> None:
        self._store, self.key, self._abort, self._wait_s = store, key, abort, wait_s
        self._lock = threading.Lock()
        self._own = False  #: this rank's training thread raised: it aborts the group itself
        self.aborted = False  #: this thread aborted the group for a peer's fault
        self._thread = threading.Thread(target=self._watch, name="slurmrt-peer-abort", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def raised(self) -> None:
        """This rank's training thread raised: from now on the group is its to abort, not this thread's."""
        with self._lock:
            self._own = True

    def tell(self, news: str) -> None:
        """The generation's news, first wins (a fault's before the "done" of a rank that finished first)."""
        with contextlib.suppress(Exception):  # the store's host is gone: the peers' own collectives fail
            self._store.compare_set(self.key, "", news)

    def close(self, timeout_s: float = 5.0) -> None:
        """The generation ended here: wake the thread (every rank's, with "done" if nothing came first) and join it."""
        self.tell(DONE)
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _watch(self) -> None:
        news = self._wait()
        if news != FAULT:
            return
        with self._lock:
            if self._own:
                return
            self.aborted = True
        logger.warning("a peer raised: aborting this rank's default group, so that a collective blocked with it "
                       "fails now instead of at NCCL's timeout")
        try:
            self._abort()
        except Exception as err:  # noqa: BLE001 - the group may already be gone; the training thread goes on
            logger.warning("aborting the default group failed: %s", err)

    def _wait(self) -> str | None:
        """The news once posted; None when the store no longer answers (its host is gone)."""
        while True:
            try:
                self._store.wait([self.key], datetime.timedelta(seconds=self._wait_s))
                got = self._store.get(self.key)
                return got.decode() if isinstance(got, bytes) else str(got)
            except Exception as err:  # noqa: BLE001
                if "timeout" not in str(err).lower() and "timed out" not in str(err).lower():
                    return None
