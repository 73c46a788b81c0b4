"""The progress lines of long saves and loads (slurmrt.checkpoint.progress)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from slurmrt.checkpoint import progress


def test_a_line_says_bytes_total_rate_and_time_left() -> None:
    assert progress.line("saving step 500", 12_300_000_000, 40_000_000_000, 10.0) == (
        "saving step 500: 12.3 GB of 40.0 GB (30 %), 1.2 GB/s, 10 s so far, about 23 s left")
    assert progress.line("loading", 2048, None, 2.0) == "loading: 2.0 kB, 1.0 kB/s, 2 s so far"
    assert progress.line("saving", 5, 4, 1.0).startswith("saving: 5 B of 4 B (100 %)")  # past the estimate


def test_a_save_is_counted_in_its_temporary_directories_only(tmp_path: Path) -> None:
    count = progress.saved_bytes(tmp_path, 7)
    assert count() == 0
    tmp = tmp_path / ".tmp-step_000000007-j1-r0-1abc"
    (tmp / "model").mkdir(parents=True)
    (tmp / "rank_00000.pt").write_bytes(b"x" * 100)
    (tmp / "model" / "w.bin").write_bytes(b"x" * 20)
    (tmp / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"y" * 1000)  # not followed
    (tmp_path / ".tmp-step_000000008-j1-r0-1abc").mkdir()
    (tmp_path / ".tmp-step_000000008-j1-r0-1abc" / "other").write_bytes(b"z" * 7)  # another step's
    assert count() == 120


def test_the_reporter_says_nothing_for_a_quick_job_then_a_line_per_interval(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="slurmrt.checkpoint.progress")
    with progress.reporting("quick", lambda: 1, None):
        pass
    assert "quick" not in caplog.text  # done before AFTER_S
    monkeypatch.setattr(progress, "AFTER_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    said = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "long" in record.getMessage():
                said.set()

    seen = Seen()
    logging.getLogger("slurmrt.checkpoint.progress").addHandler(seen)
    try:
        with progress.reporting("long", lambda: 3000, 6000):
            assert said.wait(120)  # the block outlives the first report: a line is said
    finally:
        logging.getLogger("slurmrt.checkpoint.progress").removeHandler(seen)
    assert "long: 3.0 kB of 6.0 kB (50 %)" in caplog.text
    with progress.reporting("off", lambda: 1, None, enabled=False):
        pass
    assert "off" not in caplog.text
