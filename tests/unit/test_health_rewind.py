"""The training-health ladder (re-run, rewind with the batches skipped, end), the certificates, the record beside the
checkpoints, and what retention and the recovery plan make of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmrt._errors import TrainingHealthError
from slurmrt.health.check import HealthCheck
from slurmrt.health.record import RECORD, HealthRecord, read_record, write_record
from slurmrt.health.rewind import certify, climb
from slurmrt.health.settings import HealthSection
from slurmrt.record.events import EventLog


def test_a_fault_is_re_run_then_rewound_to_the_certified_step_with_its_batches_skipped_then_ends() -> None:
    record = HealthRecord(certified=10)
    assert climb(record, 17, max_rewinds=2).action == "rerun" and record.skips == []
    rung = climb(record, 17, max_rewinds=2)
    assert (rung.action, rung.certified, record.skips, record.rewinds) == ("rewind", 10, [(11, 17)], {10: 1})
    assert record.skipped(11) and record.skipped(17) and not record.skipped(10) and not record.skipped(18)
    assert climb(record, 23, max_rewinds=2).action == "rerun"  # another step: re-run first
    assert climb(record, 23, max_rewinds=2).action == "rewind" and record.rewinds == {10: 2}
    climb(record, 30, max_rewinds=2)
    end = climb(record, 30, max_rewinds=2)
    assert end.action == "end" and "start again from checkpoint step_000000010" in end.why
    assert record.skips == [(11, 17), (11, 23)] and record.faults == {17: 2, 23: 2, 30: 2}


def test_a_fault_that_comes_back_with_nothing_certified_ends_the_run() -> None:
    record = HealthRecord()
    climb(record, 5, max_rewinds=3)
    end = climb(record, 5, max_rewinds=3)
    assert end.action == "end" and end.certified is None and "nothing to rewind to" in end.why


def test_a_checkpoint_is_certified_once_healthy_long_enough_after_it_the_newest_of_those_due() -> None:
    record, pending = HealthRecord(), {10, 20, 30}
    assert certify(record, pending, 19, after=10) is None and pending == {10, 20, 30}
    assert certify(record, pending, 30, after=10) == 20 and pending == {30} and record.certified == 20
    assert certify(record, pending, 39, after=10) is None
    assert certify(record, pending, 40, after=10) == 30 and pending == set()


def test_the_record_survives_its_round_trip_and_a_damaged_or_planted_one_reads_as_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record = HealthRecord(certified=25, faults={7: 2}, rewinds={0: 1}, skips=[(1, 7)])
    write_record(tmp_path, record)
    assert read_record(tmp_path) == record and read_record(None) == HealthRecord()
    assert read_record(tmp_path / "nothing") == HealthRecord()
    path = tmp_path / RECORD
    for bad in ("{", json.dumps({"certified": -1, "faults": {}, "rewinds": {}, "skips": []}),
                json.dumps({"certified": 3, "faults": {}, "rewinds": {}, "skips": [[9, 2]]}), "[]"):
        path.write_text(bad)
        assert read_record(tmp_path) == HealthRecord()
    path.unlink()
    os.mkfifo(path)  # planted: a reader that opened it would wait for ever
    assert read_record(tmp_path) == HealthRecord()
    assert caplog.text.count("is not a record slurmrt wrote") == 5


def _check(tmp_path: Path, **settings: int) -> tuple[HealthCheck, list[int], list[int]]:
    certified: list[int] = []
    rewound: list[int] = []
    check = HealthCheck(HealthSection(**settings), EventLog(tmp_path / "events.jsonl", job=None, restart=0, rank=0),
                        rank=0, world_size=1, directory=tmp_path, on_certified=certified.append,
                        on_rewind=rewound.append)
    check.loaded(None, lambda read: read())
    return check, certified, rewound


def test_the_check_certifies_saves_rewinds_past_a_repeated_fault_and_records_it_all(tmp_path: Path) -> None:
    check, certified, rewound = _check(tmp_path, health_certify_after=3)
    check.saved(0)
    for step in range(4):
        check.check(step, loss=1.0)
    assert certified == [0] and read_record(tmp_path).certified == 0
    check.saved(4)
    for _ in range(2):
        with pytest.raises(TrainingHealthError) as caught:
            check.check(5, loss=float("nan"))
    assert caught.value.details["action"] == "rewind" and rewound == [0]
    assert check.rewind_to() == 0 and check.rewind_to() is None  # the next load's, once
    assert [check.skip(s) for s in range(7)] == [False, True, True, True, True, True, False]
    assert read_record(tmp_path).skips == [(1, 5)]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("action")) for e in events] == [
        ("certified", None), ("training_health", "rerun"), ("training_health", "rewind")]

    again, certified, _ = _check(tmp_path, health_certify_after=3)  # a later run hears the record
    assert again.record == read_record(tmp_path) and certified == [0] and again.skip(3)


def test_retention_keeps_the_certified_checkpoint_through_a_hundred_saves_after_it(tmp_path: Path) -> None:
    from slurmrt._comm import SoloComm
    from slurmrt.checkpoint.store import CheckpointStore

    store = CheckpointStore(tmp_path, SoloComm(), keep_last=2)
    store.save({"s": 5}, 5)
    store.retention.certified = 5
    for step in range(6, 106):
        store.save({"s": step}, step)
    store.close()
    assert sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("step_*")) == [5, 104, 105]
    assert store.retention.set_aside(5, "tok") == list(range(105, 103, -1))
    got = store.load_latest()
    assert got is not None and got.step == 5 and len(list(tmp_path.glob(".tainted-step_*-tok"))) == 2


def test_the_replica_hash_sees_one_flipped_bit_in_any_width_and_names_the_odd_rank() -> None:
    import torch

    from slurmrt._errors import ConfigError
    from slurmrt.health.replicas import digest, flip_bit, odd_ranks, tensors_of

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    twin.load_state_dict(model.state_dict())
    assert int(digest(tensors_of(model))) == int(digest(tensors_of(twin)))
    before = [t.clone() for t in tensors_of(twin)]
    assert flip_bit(tensors_of(twin))
    after = tensors_of(twin)
    assert torch.isfinite(after[0]).all() and not torch.equal(before[0], after[0])  # silent: finite, close
    assert int(digest(tensors_of(model))) != int(digest(after))
    half = torch.zeros(8, dtype=torch.bfloat16)
    other = half.clone()
    assert flip_bit([other]) and int(digest([half])) != int(digest([other]))
    assert odd_ranks([7, 7, 9, 7]) == [2] and odd_ranks([5, 5]) == []
    with pytest.raises(ConfigError, match="replicas"):
        tensors_of(3)
    with pytest.raises(ConfigError, match="replicas"):
        tensors_of(["not a tensor"])


def test_with_replica_hashes_a_checkpoint_is_certified_only_where_the_replicas_agreed() -> None:
    record, pending = HealthRecord(), {10, 20}
    assert certify(record, pending, 40, after=5, agreed=15) == 10 and pending == {20}
    assert certify(record, pending, 41, after=5, agreed=24) == 20
    assert certify(HealthRecord(), {10}, 40, after=5, agreed=-1) is None  # never compared yet: none


def test_a_rewind_whose_set_aside_fails_stops_every_rank_with_one_error_and_loads_nothing(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from slurmrt._comm import SoloComm
    from slurmrt._errors import CheckpointError
    from slurmrt.checkpoint.session import CheckpointSession
    from slurmrt.checkpoint.store import CheckpointStore

    store = CheckpointStore(tmp_path, SoloComm(), keep_last=3)
    for step in (0, 5):
        store.save({"s": step}, step)
    store.close()
    planted = tmp_path / ".tainted-step_000000005-tok"  # another's directory where the rename goes
    planted.mkdir()
    (planted / "theirs").write_text("x")
    with pytest.raises(CheckpointError, match="could not be set aside before the rewind's load"):
        CheckpointSession._rewound(SimpleNamespace(_token="tok"), store, None, 0)  # type: ignore[arg-type]
    assert (tmp_path / "step_000000005").is_dir() and (planted / "theirs").read_text() == "x"  # nothing lost
