"""The NCCL side of the in-process restart (slurmrt.runtime.peerabort), at the store and process-group boundary: a
peer's fault aborts this rank's group from the watching thread; this rank's own fault, or the generation's end, does
not; a store whose host is gone ends the watch."""

from __future__ import annotations

import datetime
import threading
from typing import Any

from slurmrt.runtime.peerabort import DONE, FAULT, PeerAbort


class Store:
    """TCPStore's few calls: compare_set (first wins), a wait that blocks until the key is set, get."""

    def __init__(self, fail: str | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.fail = fail

    def compare_set(self, key: str, expected: str, value: str) -> bytes:
        with self.cond:
            if key not in self.data:
                self.data[key] = value.encode()
                self.cond.notify_all()
            return self.data[key]

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        if self.fail is not None:
            raise RuntimeError(self.fail)
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError("Wait timeout")

    def get(self, key: str) -> Any:
        return self.data[key]


def _watcher(store: Store, aborts: list[int]) -> PeerAbort:
    watcher = PeerAbort(store, "news/0", lambda: aborts.append(1), wait_s=0.05)  # timeouts: it waits again
    watcher.start()
    return watcher


def test_a_peers_fault_aborts_this_ranks_group() -> None:
    store, aborts = Store(), []
    watcher = _watcher(store, aborts)
    PeerAbort(store, "news/0", lambda: None).tell(FAULT)  # the rank that raised, elsewhere
    watcher.close()
    assert aborts == [1] and watcher.aborted


def test_this_ranks_own_fault_leaves_the_abort_to_its_training_thread() -> None:
    store, aborts = Store(), []
    watcher = _watcher(store, aborts)
    watcher.raised()
    watcher.tell(FAULT)
    watcher.close()
    assert aborts == [] and not watcher.aborted


def test_the_generations_end_or_a_store_that_is_gone_ends_the_watch_without_an_abort() -> None:
    store, aborts = Store(), []
    watcher = _watcher(store, aborts)
    watcher.close()
    assert store.data["news/0"] == DONE.encode() and aborts == []
    watcher.tell(FAULT)  # too late: the first news stands
    assert store.data["news/0"] == DONE.encode()
    gone = _watcher(Store(fail="Connection reset by peer"), aborts)
    gone.close()
    assert aborts == [] and not gone._thread.is_alive()
