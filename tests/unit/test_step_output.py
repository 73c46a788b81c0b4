"""slurmrt run reads srun's standard error as it comes: the tasks srun saw end reach the run directory at once."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slurmrt._safefs import private_dir
from slurmrt.recovery import injob
from slurmrt.recovery.tasks import StepOutput, parse_ended


def test_srun_lines_for_tasks_that_ended_are_parsed_within_the_step() -> None:
    assert parse_ended("srun: error: n2: task 1: Killed", 4) == {1: ("n2", "Killed")}
    assert parse_ended("srun: error: n3: tasks 4-7: Exited with exit code 1\n", 8) == {
        t: ("n3", "Exited with exit code 1") for t in range(4, 8)}
    assert parse_ended("srun: error: node-1.x: tasks 0,2: Segmentation fault", 4) == {
        0: ("node-1.x", "Segmentation fault"), 2: ("node-1.x", "Segmentation fault")}
    # A range beyond the step (a task's own output can say anything) is cut to the step's tasks, never expanded.
    assert parse_ended("srun: error: n1: tasks 2-999999999999: Killed", 4) == {2: ("n1", "Killed"),
                                                                                 3: ("n1", "Killed")}
    for line in ("srun: error: n1: task 9: Killed", "srun: Force Terminated StepId=5.0", "task 1: Killed",
                 "srun: error: Unable to create step", "srun: error: n1: task -1: Killed", ""):
        assert parse_ended(line, 4) == {}


def test_the_output_is_passed_on_unchanged_and_the_ended_tasks_written(tmp_path: Path) -> None:
    run_dir = private_dir(tmp_path / "run")
    src_r, src_w = os.pipe()
    sink_r, sink_w = os.pipe()
    with os.fdopen(src_r, "rb", buffering=0) as source:
        out = StepOutput(source, sink_w, run_dir, 3, ntasks=2)
        out.start()
        os.write(src_w, b"step 1 loss 0.5\rstep 2")  # a progress bar: passed on before any newline
        got = b""
        while len(got) < 22:
            got += os.read(sink_r, 100)
        assert got == b"step 1 loss 0.5\rstep 2"
        assert injob.read_ended(run_dir, 3) == {}
        os.write(src_w, b" loss 0.4\nsrun: error: n2: task 1: Kil")
        os.write(src_w, b"led\nsrun: error: n2: task 1: Killed\n")  # the same task again: once
        os.close(src_w)
        out.join(60)
    assert not out.is_alive()
    os.close(sink_w)
    rest = b""
    while chunk := os.read(sink_r, 1000):
        rest += chunk
    os.close(sink_r)
    assert got + rest == (b"step 1 loss 0.5\rstep 2 loss 0.4\nsrun: error: n2: task 1: Killed\n"
                          b"srun: error: n2: task 1: Killed\n")
    assert injob.read_ended(run_dir, 3) == {1: ("n2", "Killed")} == out.ended
    assert injob.read_ended(run_dir, 2) == {}  # another attempt's: none


def test_an_ended_record_slurmrt_did_not_write_is_not_believed(tmp_path: Path) -> None:
    run_dir = private_dir(tmp_path / "run")
    path = injob.ended_path(run_dir, 0)
    for text in ('{"attempt": 0, "tasks": {"x": {"node": "n1", "how": "Killed"}}}', "[1]", "{",
                 '{"attempt": 1, "tasks": {}}', '{"attempt": 0, "tasks": {"1": {"node": 5, "how": "Killed"}}}',
                 "[" * 50000):
        path.write_text(text)
        assert injob.read_ended(run_dir, 0) == {}
    path.write_text('{"attempt": 0, "tasks": {"1": {"node": "n1", "how": "Killed"}}}')
    assert injob.read_ended(run_dir, 0) == {1: ("n1", "Killed")}


def test_a_sink_that_is_gone_never_blocks_srun(tmp_path: Path) -> None:
    """The job's output closed (the supervisor's stderr gone): srun's output is still drained."""
    run_dir = private_dir(tmp_path / "run")
    src_r, src_w = os.pipe()
    sink_r, sink_w = os.pipe()
    os.close(sink_r)
    done = threading.Event()
    with os.fdopen(src_r, "rb", buffering=0) as source:
        out = StepOutput(source, sink_w, run_dir, 0, ntasks=2)
        out.start()

        def write() -> None:
            for _ in range(100):
                os.write(src_w, b"x" * 65536)
            os.write(src_w, b"\nsrun: error: n1: task 0: Killed\n")
            os.close(src_w)
            done.set()

        threading.Thread(target=write, daemon=True).start()
        out.join(120)
    assert done.is_set() and not out.is_alive()
    assert out.ended == {0: ("n1", "Killed")}
    os.close(sink_w)
