"""The kill switch and the watcher loop, one iteration at a time, on a fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from slurmrt import _clock
from slurmrt.stop.killswitch import KillSwitch
from slurmrt.stop.watcher import Watcher


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [1000.0]
    monkeypatch.setattr(_clock, "wall", lambda: t[0])
    monkeypatch.setattr(_clock, "mono", lambda: t[0])
    return t


def test_the_switch_is_seen_once_at_the_poll_after_it_appears(tmp_path: Path, now: list[float]) -> None:
    switch = KillSwitch(tmp_path / "STOP")
    switch.poll()
    assert switch.seen is None
    (tmp_path / "STOP").touch()
    now[0] += 5
    switch.poll()
    now[0] += 5
    switch.poll()
    assert switch.seen == 1005.0


def test_a_poller_that_raises_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    def broken() -> None:
        raise OSError("stale NFS handle")

    watcher = Watcher([broken, lambda: ran.append("end time")], period_s=5)
    with caplog.at_level(logging.ERROR):
        watcher.poll_once()
        watcher.poll_once()
    assert ran == ["end time", "end time"]
    assert caplog.text.count("OSError: stale NFS handle") == 2
