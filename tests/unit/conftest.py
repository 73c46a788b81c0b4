"""Unit tests are pure and fast: none starts a process (what does belongs in tests/integration)."""

from __future__ import annotations

import _posixsubprocess
import contextlib
import multiprocessing.util
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrt.record import code

# matplotlib's first import asks fontconfig (`fc-list`) for the fonts, once per cache: before the guard below. The
# picture's tests skip without matplotlib.
with contextlib.suppress(ImportError):
    import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test starts no process (subprocess, fork, spawn, multiprocessing): it belongs "
                             "in tests/integration")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)  # what subprocess and multiprocessing's spawn call
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
    # The one process init() itself starts: rank 0 asks git which commit runs (tests/integration reads it for real).
    monkeypatch.setattr(code, "_git", lambda directory: None)
    yield


def fake_slurm(monkeypatch: pytest.MonkeyPatch, where: Path) -> Path:
    """Slurm's commands stood in at the process boundary (``slurmrt._slurm.run``), in this process: what
    ``tests/integration/launch.py:fake_bin`` does with scripts. ``scontrol``, ``squeue`` and ``scancel`` append their
    calls to ``$FAKE_SLURM_LOG``; ``squeue`` answers ``$FAKE_END_TIME`` (squeue's local-time format) or N/A, after
    ``$FAKE_START_TIME`` (or N/A) when asked for ``-o "%S %e"``;
    ``scontrol requeue`` fails with ``$FAKE_REQUEUE_FAIL``; ``scontrol show job`` prints ``$FAKE_JOB_INFO`` (or
    nothing); ``sbatch`` prints ``$FAKE_SBATCH_ID``, or fails without it. They exist while ``where`` is on
    PATH, as the scripts would; returns ``where``, to put on PATH."""
    from slurmrt import _slurm

    real = _slurm.run

    def run(command: str, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str] | str:
        if command not in ("scontrol", "squeue", "scancel", "sbatch", "sinfo") or \
                str(where) not in os.environ["PATH"].split(os.pathsep):
            return real(command, *args, timeout_s=timeout_s)
        with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
            log.write(" ".join(args if command == "scontrol" else (command, *args)) + "\n")
        out, err, code = "", "", 0
        if command == "squeue":  # -o "%S %e": the run's start ($FAKE_START_TIME, or N/A), then the end
            end, start = os.environ.get("FAKE_END_TIME"), os.environ.get("FAKE_START_TIME")
            said = [time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(t))) if t else "N/A" for t in (start, end)]
            out = (" ".join(said) if "%S %e" in args else said[1]) + "\n"
        if command == "scontrol" and args[:1] == ("requeue",) and os.environ.get("FAKE_REQUEUE_FAIL"):
            err, code = "Job is not requeueable\n", 1
        if command == "scontrol" and args[:2] == ("show", "job") and "FAKE_JOB_INFO" in os.environ:
            out = os.environ["FAKE_JOB_INFO"] + "\n"
        if command == "sbatch":
            out, err, code = (os.environ["FAKE_SBATCH_ID"] + "\n", "", 0) if os.environ.get("FAKE_SBATCH_ID") else \
                ("", "sbatch: error: QOSMaxSubmitJobPerUserLimit\n", 1)
        return subprocess.CompletedProcess([command, *args], code, out, err)

    monkeypatch.setattr(_slurm, "run", run)
    where.mkdir(parents=True, exist_ok=True)
    return where
