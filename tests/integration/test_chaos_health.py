"""The training-health campaign (benchmarks/chaos_health.py) at its smallest, in every CI run: one job of each fault
(a NaN once, a NaN each time, a loss spike, a flipped bit) and a fault-free one, each judged by its own records and
bit for bit against its comparator. RESULTS.md has the full campaign (100 faults over 5 seeds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import chaos_health

pytestmark = pytest.mark.timeout(1200)


def test_one_job_of_each_training_health_fault_is_found_recovered_and_ends_bitwise(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = chaos_health.main(["--seeds", "1", "--first-seed", "11", "--trials", "4", "--clean", "1", "--jobs", "1",
                              "--keep", str(tmp_path)])
    report = capsys.readouterr().out
    assert code == 0, report
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    assert {"nan", "nan-repeats", "spike", "flip", "none"} <= set(rows), report
    assert "5 jobs" in report and "0 failed" in report, report


def test_a_judge_that_sees_a_resume_past_the_fault_calls_it_tainted() -> None:
    trial = chaos_health.Trial(0, 0, "nan", 1, 20)
    rerun = {"event": "training_health", "step": 20, "action": "rerun", "certified": None}
    assert chaos_health.tainted(trial, [rerun, {"event": "resume", "step": 15}]) == []
    assert chaos_health.tainted(trial, [rerun, {"event": "resume", "step": 20}]) == \
        ["re-run of step 20 resumed from step 20"]
    rewind = {"event": "training_health", "step": 20, "action": "rewind", "certified": 10}
    assert chaos_health.tainted(trial, [rewind, {"event": "resume", "step": 15}]) == \
        ["rewound to 10 but resumed from 15"]
    flip = chaos_health.Trial(0, 0, "flip", 1, 21)
    assert flip.found_at == 24 and chaos_health.tainted(flip, [{**rerun, "step": 24}, {"event": "resume",
                                                                                      "step": 21}])
