"""Slurm's client commands, run the one way: found on PATH, bounded in time, failures returned in words."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmrt import _slurm
from slurmrt.recovery.policy import requeue


def _command(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)


def test_a_missing_command_is_said_not_raised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _slurm.run("squeue", "-h") == "squeue not found on PATH"
    done, message = requeue("42")
    assert not done and message.startswith("scontrol not found on PATH: exiting with 75")


def test_a_command_that_never_answers_is_cut_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _command(tmp_path, "scancel", "exec sleep 60")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    out = _slurm.run("scancel", "42", timeout_s=0.2)
    assert isinstance(out, str) and "`scancel 42` failed" in out and "timed out" in out


def test_a_refusal_keeps_its_exit_code_and_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _command(tmp_path, "scontrol", 'echo "Requested operation is presently disabled" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done, message = requeue("42")
    assert not done and message == "scontrol requeue 42 refused (exit 1): Requested operation is presently disabled"
