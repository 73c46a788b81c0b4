"""A misconfiguration said once per node (runtime/misconfigured.py): the node's first task says it and leaves a
marker; the others wait for that marker, so that srun's --kill-on-bad-exit, set off by whichever task exits first,
cannot end the first task before it said anything; a task that waits in vain says it itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurmrt.runtime import misconfigured


@pytest.mark.parametrize(("env", "first"), [({"SLURM_LOCALID": "0"}, True), ({"SLURM_LOCALID": "3"}, False),
                                            ({"LOCAL_RANK": "1", "SLURM_LOCALID": "0"}, False), ({}, True),
                                            ({"SLURM_LOCALID": "x"}, True)])
def test_the_first_task_of_a_node_is_the_launchers_local_rank_0(env: dict[str, str], first: bool) -> None:
    assert misconfigured.first_on_node(env) is first


def test_the_other_tasks_find_the_first_tasks_marker_and_not_an_earlier_launchs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TMPDIR": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    said = misconfigured._said_path(env)
    assert said is not None and said.parent.stat().st_mode & 0o077 == 0  # the node's private directory
    monkeypatch.setattr(misconfigured, "WAIT_S", 0.2)
    assert misconfigured._wait_for(said) is False  # nobody said it: this task says it itself
    misconfigured._mark(said)
    assert misconfigured._wait_for(said) is True
    old = time.time() - 3600  # left by a launch an hour ago, with the same job, step and parent
    os.utime(said, (old, old))
    monkeypatch.setattr(misconfigured, "process_age", lambda pid: 1.0)
    assert misconfigured._wait_for(said) is False
    misconfigured._mark(said)  # the first task of this launch touches it again
    assert misconfigured._wait_for(said) is True


def test_the_passed_marker_counts_only_when_a_running_task_of_this_launch_wrote_it(tmp_path: Path) -> None:
    passed = tmp_path / "misconfigured-7-0-passed"
    since = time.time() - 60.0
    assert misconfigured._sibling_wrote(passed, since) is False  # none
    misconfigured._mark(passed)  # this process: under the same parent as itself
    assert misconfigured._sibling_wrote(passed, since) is True
    assert misconfigured._sibling_wrote(passed, time.time() + 60.0) is False  # older than this launch
    passed.write_text("1")  # a process that runs, under another parent
    assert misconfigured._sibling_wrote(passed, since) is False
    passed.write_text(str(2**22 + 1))  # above any pid Linux gives: a task gone since
    assert misconfigured._sibling_wrote(passed, since) is False
    passed.write_text("not a pid")
    assert misconfigured._sibling_wrote(passed, since) is False
