"""slurmrt run's block about an in-job restart, from the leader's request: what a malformed request still gives."""

from __future__ import annotations

from slurmrt.recovery.report import Failure, block, stacks_pattern


def test_the_block_says_what_failed_where_what_was_done_how_long_and_where_the_stacks_are() -> None:
    request = {"exclude": ["n2"], "why": "long detail", "suspects": "rank(s) 1 did not answer", "since": 100.0,
               "stacks": "/ckpt/stacks-7-0.0-rank*.txt"}
    lines = block(Failure.asked(request, 0, 137, ["n2"]), 1, 3, ("n1", "n3"), (), now=103.25)
    assert lines == ["in-job restart 1 of at most 3:",
                     "  failed:   step 0 (exit code 137): rank(s) 1 did not answer",
                     "  left out: n2",
                     "  new step: 1 on n[1,3], no spare left",
                     "  took:     3.2 s from the failure to the new step",
                     "  stacks:   /ckpt/stacks-7-0.0-rank*.txt"]


def test_a_straggler_left_out_on_purpose_is_said_as_a_stop_not_a_failure() -> None:
    request = {"exclude": ["n2"], "why": "n2 is a straggler: 3.1x the others' compute", "since": 100.0,
               "trigger": "straggler"}
    lines = block(Failure.asked(request, 0, 3, ["n2"]), 1, 3, ("n1", "n3"), (), now=101.0)
    assert lines[1] == "  stopped:  step 0, to leave a straggler out: n2 is a straggler: 3.1x the others' compute"
    assert lines[4] == "  took:     1.0 s from the stop to the new step"
    assert not any("failed" in line or "exit code" in line for line in lines), lines


def test_a_node_left_out_after_a_transient_training_fault_is_said_as_a_stop_but_a_failed_health_check_fails() -> None:
    why = "a step computed wrong once, right on its re-run (rt.check: a transient fault, the hardware suspect)"
    stopped = {"exclude": ["n2"], "why": why, "since": 100.0, "trigger": "unhealthy", "planned": True}
    lines = block(Failure.asked(stopped, 0, 6, ["n2"]), 1, 3, ("n1", "n3"), (), now=101.0)
    assert lines[1] == f"  stopped:  step 0, to leave out a node that computed a step wrong: {why}"
    failed = {"exclude": ["n2"], "why": "health check: no GPU", "since": 100.0, "trigger": "unhealthy"}
    assert block(Failure.asked(failed, 0, 6, ["n2"]), 1, 3, ("n1", "n3"), ())[1].startswith("  failed:   step 0")


def test_a_malformed_request_still_gives_a_block() -> None:
    failure = Failure.asked({"exclude": ["n2"], "since": "soon", "stacks": ["x"], "suspects": None}, 2, 5, ["n2"])
    assert failure.why == "n2 failed" and failure.stacks is None and isinstance(failure.since, float)
    assert Failure.asked({"since": True}, 0, 5, ["n4"]).since != 1.0  # a boolean is no time
    lines = block(failure, 3, 3, ("n1",), ("n5",), now=failure.since)
    assert lines[3] == "  new step: 3 on n1, spare n5" and not any(line.startswith("  stacks") for line in lines)


def test_the_stacks_pattern_names_every_rank_of_the_step() -> None:
    from pathlib import Path

    assert stacks_pattern(Path("/c/events-7.jsonl"), "7", 1, 2) == "/c/stacks-7-1.2-rank*.txt"
    assert stacks_pattern(None, "7", 1, 2) is None
