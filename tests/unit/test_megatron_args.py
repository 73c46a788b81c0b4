"""The Megatron-LM arguments slurmrt adds: the exit signal handler, and the duration from the job's end time."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from slurmrt.integrations.megatron import NEVER_MIN, megatron_argv


def _rt(end: float | None, rank: int = 0, deadline: bool = True) -> Any:
    return SimpleNamespace(rank=rank, end_time=end, options=SimpleNamespace(
        deadline=deadline, deadline_margin_s=30.0, save_time_s=30.0))


def test_the_duration_is_the_time_left_less_margin_and_save_in_whole_minutes() -> None:
    argv, ends = megatron_argv(_rt(time.time() + 3600), ["--save", "ckpt"])
    assert argv == ["--save", "ckpt", "--exit-signal-handler", "--exit-duration-in-mins", "58"]
    assert ends is not None and abs(ends - (time.time() + 58 * 60)) < 5


def test_a_shorter_duration_given_by_the_user_is_kept_and_flags_are_not_doubled() -> None:
    argv, _ = megatron_argv(_rt(time.time() + 3600), ["--exit-signal-handler", "--exit-duration-in-mins", "10"])
    assert argv == ["--exit-signal-handler", "--exit-duration-in-mins", "10"]


def test_without_an_end_time_or_the_deadline_the_duration_never_fires_on_its_own() -> None:
    for rt in (_rt(None, rank=1), _rt(time.time() + 3600, deadline=False)):
        argv, ends = megatron_argv(rt, [], wait_end_time_s=0)
        assert argv[-1] == str(NEVER_MIN) and ends is None
    argv, _ = megatron_argv(_rt(time.time() + 30), [])
    assert argv[-1] == "1", "at least one minute: Megatron takes whole minutes"
