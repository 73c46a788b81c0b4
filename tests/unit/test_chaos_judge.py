"""The fault campaign's judge (benchmarks/chaos.py), fed runs that went wrong in ways a trial must catch: negative
controls (issue 52). A judge that passes everything would make every campaign a success."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import chaos

WEIGHTS = [0.5, -0.25]


def _trial(tmp_path: Path, runs: list[list[tuple[str, dict[str, Any]]]], weights: list[float] = WEIGHTS) -> Path:
    """A trial's directory: the event log of ``runs`` (each a list of (event, fields)), the last run's weights."""
    lines, t = [], 0
    for restart, events in enumerate(runs):
        for event, fields in events:
            t += 1
            lines.append(json.dumps({"time": f"2026-11-27T10:{t // 60:02d}:{t % 60:02d}+00:00", "event": event,
                                     "job": "7", "restart": restart, "rank": 0, **fields}))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "events-7.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / f"run{len(runs) - 1}").mkdir()
    (tmp_path / f"run{len(runs) - 1}" / "rank0.json").write_text(json.dumps({"w": weights}))
    return tmp_path


def _run(loaded: int | None, first: int, saves: list[int], end: str = "REQUEUED") -> list[tuple[str, dict[str, Any]]]:
    start = ("resume", {"step": loaded}) if loaded is not None else ("fresh_start", {})
    return [("init", {}), start, ("progress", {"step": first}),
            *[("save", {"step": s, "seconds": 0.1, "blocking": False}) for s in saves],
            ("exit", {"code": 0 if end == "FINISHED" else 3, "outcome": end})]


def test_a_trial_that_went_on_where_it_should_survives(tmp_path: Path) -> None:
    trial = _trial(tmp_path, [_run(None, 0, [9, 19]), _run(19, 20, [29, 39], "FINISHED")])
    assert chaos.verdict(trial, WEIGHTS, 0, "") == ("survived", "")


def test_a_resume_from_an_older_checkpoint_than_the_newest_is_lost(tmp_path: Path) -> None:
    trial = _trial(tmp_path, [_run(None, 0, [9, 19]), _run(9, 10, [29, 39], "FINISHED")])
    got, said = chaos.verdict(trial, WEIGHTS, 0, "")
    assert got == "lost" and "resumed from step 9, older than the newest committed checkpoint, step 19" in said


def test_a_step_skipped_or_applied_twice_after_a_resume_is_lost(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    skipped = _trial(tmp_path / "a", [_run(None, 0, [19]), _run(19, 21, [39], "FINISHED")])
    assert chaos.verdict(skipped, WEIGHTS, 0, "")[0] == "lost"
    assert "a step skipped" in chaos.verdict(skipped, WEIGHTS, 0, "")[1]
    twice = _trial(tmp_path / "b", [_run(None, 0, [19]), _run(19, 19, [39], "FINISHED")])
    assert "a step applied twice" in chaos.verdict(twice, WEIGHTS, 0, "")[1]


def test_weights_that_differ_from_the_uninterrupted_run_are_lost(tmp_path: Path) -> None:
    trial = _trial(tmp_path, [_run(None, 0, [19], "FINISHED")], weights=[0.5, -0.2500001])
    got, said = chaos.verdict(trial, WEIGHTS, 0, "")
    assert got == "lost" and "!= uninterrupted" in said


def test_a_fresh_start_after_a_committed_checkpoint_is_lost(tmp_path: Path) -> None:
    trial = _trial(tmp_path, [_run(None, 0, [19]), _run(None, 0, [39], "FINISHED")])
    assert chaos.verdict(trial, WEIGHTS, 0, "")[0] == "lost"


def test_a_job_that_failed_before_its_training_finished_is_dead(tmp_path: Path) -> None:
    trial = _trial(tmp_path, [_run(None, 0, [19])])  # its last run requeued, and nothing came after
    assert chaos.verdict(trial, WEIGHTS, 1, "the end of the output")[0] == "dead"
