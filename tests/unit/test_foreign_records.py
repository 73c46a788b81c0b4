"""A record that is not the user's own is not believed (issue 53, class 1): another user, allowed by a sticky
world-writable directory (mode 1777, as teams use for /scratch/team), creates the job's event log or ledger first.
Run as root with a second uid; skipped otherwise."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from slurmrt.record.events import Event, EventLog, read_events
from slurmrt.record.ledger import Ledger
from slurmrt.record.runs import measured_earlier, runs_of

OTHER_UID = 65534  # nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to leave a file owned by a second uid")


def _planted(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o1777)
    path.write_text(text)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


def test_an_event_log_another_user_created_first_is_neither_believed_nor_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its forged figures (a save of 1 ms, a step of 1 ms: a deadline that lets the job run past its end without a
    save) change no decision: the deadline's measurements, the loop guard's runs and the cadence's history ignore
    it, each with a warning naming it; the job's own events are not appended to it (a neighbour could read them)."""
    line = {"time": "2026-11-27T01:00:00+00:00", "job": "5", "restart": 0, "rank": 0}
    log = _planted(tmp_path / "scratch" / "events-5.jsonl", "\n".join(json.dumps({**line, **e}) for e in (
        {"event": "save", "step": 10, "seconds": 0.001}, {"event": "progress", "step": 10, "step_s": 0.001},
        {"event": "exit", "code": 3, "outcome": "REQUEUED", "why": "x", "lead": True})) + "\n")
    before = log.read_text()
    assert len(list(read_events(log))) == 3  # a viewer (slurmrt status) still shows it
    with caplog.at_level(logging.WARNING):
        assert measured_earlier(log).save_s is None and measured_earlier(log).step_s is None
        assert runs_of(log) == []
        assert list(read_events(log, own=True)) == []
        EventLog(log, job="5", restart=1, rank=0).emit(Event.INIT, world_size=1)
    assert log.read_text() == before, "the job wrote into another user's file"
    said = [r.getMessage() for r in caplog.records if "not to you" in r.getMessage()]
    assert said and all(str(log) in s and f"uid {OTHER_UID}" in s for s in said)


def test_a_bad_node_ledger_another_user_owns_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A forged ledger naming every node would keep the user's jobs off the whole cluster."""
    path = _planted(tmp_path / "state" / "bad-nodes.json", json.dumps(
        {"version": 1, "nodes": {n: {"reason": "hang", "job": "1", "first": 1.8e9, "last": 4e9, "count": 9}
                                 for n in ("n1", "n2", "n3")}}))
    with caplog.at_level(logging.WARNING):
        assert Ledger(path).nodes() == []
    assert any(str(path) in r.getMessage() and "not to you" in r.getMessage() for r in caplog.records)


def test_the_users_own_records_are_still_believed(tmp_path: Path) -> None:
    """The control: the same files, the user's own, are read."""
    log = tmp_path / "events-5.jsonl"
    EventLog(log, job="5", restart=0, rank=0).emit(Event.SAVE, step=10, seconds=2.0)
    assert measured_earlier(log).save_s == 2.0
    path = tmp_path / "bad-nodes.json"
    Ledger(path).record(["n2"], reason="lost", job="5")
    assert Ledger(path).nodes() == ["n2"]


@pytest.mark.parametrize("name", ["experiment.json", "trackers.json"])
def test_an_experiment_or_tracker_file_another_user_planted_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    """A neighbour's experiment id or tracker run id would send this job's curves into their run: refused at init()
    with one line that names the file and the fix, never read."""
    from slurmrt import ConfigError
    from slurmrt.record import experiment

    assert name in (experiment.EXPERIMENT_FILE, experiment.TRACKERS_FILE)
    planted = _planted(tmp_path / "ckpt" / name, json.dumps({"id": "theirs-1", "wandb": "theirs"}))
    read = (lambda: experiment.establish(planted.parent, job="5")) if name == experiment.EXPERIMENT_FILE \
        else (lambda: experiment.read_trackers(planted.parent))
    with pytest.raises(ConfigError, match=rf"{planted}.*belongs to .*uid {OTHER_UID}.*not to you.*fix or remove it"):
        read()
