"""Inputs that a user types (issue 53, class 4): every parse error is one line that names the value, the rule and
the fix, with exit code 2, never a traceback; the forms the help shows are taken."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest

from slurmrt._errors import LeaseError, SlurmrtError
from slurmrt.cli import _joined, build_parser, main

SLURM = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}


def _stray_quote(tmp_path: Path) -> str:
    trace = tmp_path / "trace.csv"
    trace.write_text('10,hang\n"20,hang\n30,hang\n')
    return str(trace)


@pytest.mark.parametrize(("argv", "said"), [
    (["env", "--json", "--megatron-args", "--tensor-model-parallel-size 2 'x"], "No closing quotation"),
    (["sim", "--trace", "TRACE", "--", "true"], "a double quote with no closing one"),
    (["run", "--spare-nodes", "-1", "--", "true"], "--spare-nodes -1: a number of nodes held back, 0 or more"),
    (["run", "--srun-args", "--x='y", "--", "true"], "No closing quotation"),
    (["status", "MISSING"], "does not exist"),
])
def test_a_typed_value_that_does_not_parse_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], said: str) -> None:
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    argv = [_stray_quote(tmp_path) if a == "TRACE" else str(tmp_path / "nope") if a == "MISSING" else a for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and said in lines[0], err.getvalue()


def test_a_command_line_option_takes_a_value_that_starts_with_a_dash() -> None:
    """`slurmrt run --srun-args '--gpus-per-task=1'`, as its own --help shows it (argparse alone refuses it)."""
    args = build_parser().parse_args(_joined(["run", "--srun-args", "--gpus-per-task=1", "--spare-nodes", "1", "--",
                                              "python", "train.py", "--srun-args", "x"]))
    assert args.srun_args == "--gpus-per-task=1" and args.spare_nodes == 1
    assert args.command[-2:] == ["--srun-args", "x"]  # the training's own, untouched


def test_a_checkpoint_directory_that_is_a_file_says_so(tmp_path: Path) -> None:
    from slurmrt.checkpoint.lease import Lease

    (tmp_path / "ckpt").write_text("")
    with pytest.raises(LeaseError, match="is a file, not a directory"):
        Lease(tmp_path / "ckpt", owner="me").acquire()


def _planted_lease(directory: Path, heartbeat: object) -> None:
    directory.mkdir()
    (directory / ".slurmrt-lease.json").write_text(json.dumps(
        {"owner": "999", "host": "elsewhere", "pid": 1, "start": None, "heartbeat": heartbeat, "job": "999"}))


def test_a_lease_whose_heartbeat_lies_in_the_future_says_so_and_what_to_do(tmp_path: Path) -> None:
    from slurmrt.checkpoint.lease import Lease

    _planted_lease(tmp_path / "ckpt", time.time() + 3600)
    with pytest.raises(LeaseError) as refused:
        Lease(tmp_path / "ckpt", owner="5", host="here").check()
    said = str(refused.value)
    assert re.search(r"heartbeat 3[56]\d\d s in the future", said), said  # not "0 s ago"
    assert "clock" in said and "remove " + str(tmp_path / "ckpt" / ".slurmrt-lease.json") in said


@pytest.mark.parametrize("heartbeat", [float("nan"), float("inf"), 1e300, -5.0, "soon", True])
def test_a_lease_whose_heartbeat_is_no_time_is_damaged_and_replaced(tmp_path: Path, heartbeat: object,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from slurmrt.checkpoint.lease import Lease

    _planted_lease(tmp_path / "ckpt", heartbeat)  # json.dumps writes NaN and Infinity, which Python reads back
    assert Lease(tmp_path / "ckpt", owner="5", host="here").check() is None
    assert "is damaged (not a slurmrt lease): it is replaced" in caplog.text


def test_status_on_a_directory_it_cannot_list_says_permission_denied(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads every directory, so the refusal comes from the access check at the process boundary."""
    import slurmrt.cli.status as status_cli

    (tmp_path / "events-5.jsonl").write_text("")
    monkeypatch.setattr(status_cli.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(SlurmrtError, match=rf"^{tmp_path}: permission denied \(its event logs cannot be listed\)$"):
        status_cli.status([tmp_path])
