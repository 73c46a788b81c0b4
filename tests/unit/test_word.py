"""`slurmrt run`'s word to its step (slurmrt.recovery.word): read whole or not at all, each signal recorded once, the
end time the deadline asks for; a damaged or planted file changes nothing."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from slurmrt.recovery.facts import InJob
from slurmrt.recovery.word import Word, WordReader, listen, read_word, word_path, write_word


def test_the_word_is_read_back_as_written(tmp_path: Path) -> None:
    write_word(tmp_path, 3, Word(1.0, 2.5, {"SIGUSR1": 2.0}))
    assert read_word(word_path(tmp_path, 3)) == Word(1.0, 2.5, {"SIGUSR1": 2.0})
    assert read_word(word_path(tmp_path, 4)) is None


@pytest.mark.parametrize("text", ['{"start": 1, "end": "soon", "signals": {}}', '{"end": 1e999, "signals": {}}',
                                  '{"end": -5, "signals": {}}', '{"signals": {"SIGNOPE": 1}}', '{"end": 1}',
                                  '{"signals": {"SIGUSR1": null}}', '[1, 2]', 'not json',
                                  '{"end": true, "signals": {}}'])
def test_a_word_slurmrt_run_would_never_write_is_ignored(tmp_path: Path, text: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    word_path(tmp_path, 0).write_text(text)
    assert read_word(word_path(tmp_path, 0)) is None
    assert "ignored" in caplog.text


def test_a_fifo_planted_as_the_word_is_not_opened_for_ever(tmp_path: Path) -> None:
    import os

    os.mkfifo(word_path(tmp_path, 0))
    assert read_word(word_path(tmp_path, 0)) is None


def test_the_reader_records_each_signal_once_and_gives_the_deadline_its_times(tmp_path: Path) -> None:
    got: list[tuple[signal.Signals, float]] = []
    reader = WordReader(tmp_path, 0, lambda s, at: got.append((s, at)))
    reader.poll()
    assert got == [] and reader.times("7") == (None, None)  # not written yet
    write_word(tmp_path, 0, Word(10.0, 99.0, {"SIGUSR1": 50.0}))
    reader.poll()
    reader.poll()
    assert got == [(signal.SIGUSR1, 50.0)] and reader.times("7") == (10.0, 99.0)
    write_word(tmp_path, 0, Word(10.0, 120.0, {"SIGUSR1": 50.0, "SIGUSR2": 60.0}))
    reader.poll()
    assert got == [(signal.SIGUSR1, 50.0), (signal.SIGUSR2, 60.0)] and reader.times("7") == (10.0, 120.0)
    word_path(tmp_path, 0).write_text("damaged, and longer than before")
    assert reader.times("7") == (10.0, 120.0)  # the last sound word stands


def test_rank_0_under_slurmrt_run_asks_the_word_and_nobody_else_asks_at_all(tmp_path: Path) -> None:
    write_word(tmp_path, 2, Word(5.0, 3600.0, {}))
    in_job = InJob(tmp_path, 2)
    end, word = listen(in_job, lambda s, at: None, {}, job_id="7", lead=True, refresh_s=60.0)
    assert word is not None and end.asks
    end.poll()
    assert end.value == 3600.0 and end.started == 5.0
    other, none = listen(in_job, lambda s, at: None, {}, job_id="7", lead=False, refresh_s=60.0)
    assert none is None and not other.asks


def test_without_slurm_commands_or_slurmrt_run_init_says_what_cannot_work_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a container: none of Slurm's commands
    listen(None, lambda s, at: None, {}, job_id="7", lead=True, refresh_s=60.0)
    said = [r.getMessage() for r in caplog.records if "no squeue or scontrol here" in r.getMessage()]
    assert len(said) == 1 and "end time is unknown" in said[0] and "requeue cannot be made" in said[0]
    assert "slurmrt run" in said[0] and "containers.md" in said[0]
    caplog.clear()
    listen(None, lambda s, at: None, {}, job_id=None, lead=True, refresh_s=60.0)  # not a Slurm job: nothing to say
    assert not caplog.records


def test_a_signal_passed_on_is_recorded_only_when_it_is_one_slurmrt_records() -> None:
    from slurmrt.stop.signals import SignalRecorder

    rec = SignalRecorder((signal.SIGUSR1, signal.SIGTERM))
    rec.record(signal.SIGUSR2, 1.0)
    rec.record(signal.SIGUSR1, 2.0)
    rec.record(signal.SIGUSR1, 3.0)
    assert rec.first_seen == {signal.SIGUSR1: 2.0} and rec.count[signal.SIGUSR1] == 2
    assert json.dumps(sorted(s.name for s in rec.first_seen)) == '["SIGUSR1"]'


def test_a_time_limit_changed_outside_reaches_the_deadline_at_the_next_turn(tmp_path: Path) -> None:
    """Under slurmrt run the end time is a file the supervisor refreshes: read at every watcher turn (the word's
    poll reads it, the end time takes what it read), not every end_time_refresh_s."""
    write_word(tmp_path, 0, Word(5.0, 3600.0, {}))
    end, word = listen(InJob(tmp_path, 0), lambda s, at: None, {}, job_id="7", lead=True, refresh_s=900.0)
    assert word is not None
    end.poll()
    assert end.value == 3600.0
    write_word(tmp_path, 0, Word(5.0, 7200.0, {}))  # scontrol update TimeLimit=..., asked by the supervisor
    word.poll()
    end.poll()
    assert end.value == 7200.0


def test_nothing_is_said_when_nothing_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """No squeue, but Slurm sets the end time itself (23.02 and newer), and scontrol is there: nothing to say."""
    (tmp_path / "scontrol").write_text("#!/bin/sh\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    listen(None, lambda s, at: None, {"SLURM_JOB_END_TIME": "1800000000"}, job_id="7", lead=True, refresh_s=60.0)
    assert not caplog.records
