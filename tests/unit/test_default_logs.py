"""The handler init() gives slurmrt's own lines, and the job's lock file that goes at its clean end."""

from __future__ import annotations

import io
import logging
import os
import re

import pytest

from slurmrt import log
from slurmrt.runtime import logs


@pytest.fixture
def bare_logging(monkeypatch: pytest.MonkeyPatch):
    """A program that configured no logging: no handler on ``slurmrt``, and ``slurmrt`` restored afterwards. The
    test sets the root logger's handlers aside itself (:func:`_no_root_handlers`): pytest adds its capture handler
    after the fixtures ran."""
    own = logging.getLogger("slurmrt")
    monkeypatch.setattr(own, "handlers", [])
    monkeypatch.setattr(own, "propagate", True)
    monkeypatch.setattr(own, "level", logging.NOTSET)
    monkeypatch.setattr(log, "_own_prefix", None)
    monkeypatch.setenv("SLURMRT_LOCK_FILE", os.devnull)
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    return own


def _no_root_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger(), "handlers", [])


def test_rank_0_says_info_with_time_and_host_and_rank_and_the_root_logger_is_left_alone(bare_logging, monkeypatch):
    _no_root_handlers(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    handler = logs.install_default(0)
    assert handler is not None and bare_logging.handlers == [handler]
    assert logging.getLogger().handlers == [] and not bare_logging.propagate
    logging.getLogger("slurmrt.checkpoint.store").info("checkpoint step %d committed", 20)
    log.flush()
    assert re.fullmatch(r"\[n7:0\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO slurmrt: checkpoint step 20 committed\n",
                        stream.getvalue()), stream.getvalue()
    assert logs.install_default(0) is None and len(bare_logging.handlers) == 1  # a second init() adds nothing


def test_the_other_ranks_say_warnings_only(bare_logging, monkeypatch):
    _no_root_handlers(monkeypatch)
    monkeypatch.setenv("RANK", "3")
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.install_default(3)
    logging.getLogger("slurmrt.x").info("rank 0's news")
    logging.getLogger("slurmrt.x").warning("rank 3 received SIGUSR1")
    log.flush()
    assert stream.getvalue().count("\n") == 1 and "[n7:3]" in stream.getvalue() and "WARNING" in stream.getvalue()


def test_a_program_that_configured_logging_or_turned_it_off_keeps_its_own(bare_logging, monkeypatch):
    assert logs.install_default(0, wanted=False) is None and bare_logging.handlers == []
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    assert logs.install_default(0) is None and bare_logging.handlers == [] and bare_logging.propagate
    bare_logging.setLevel(logging.DEBUG)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    logs.install_default(1)
    assert bare_logging.level == logging.DEBUG  # the program's level is kept


def test_the_job_lock_in_the_submit_directory_goes_at_the_end_and_nothing_else(tmp_path, monkeypatch):
    env = {"SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": str(tmp_path)}
    lock = tmp_path / ".slurmrt-42.lock"
    lock.write_text("")
    other = tmp_path / ".slurmrt-43.lock"
    other.write_text("")
    logs.remove_job_lock(env)
    assert not lock.exists() and other.exists()
    lock.symlink_to(other)  # not a regular file of this user: left alone
    logs.remove_job_lock(env)
    assert lock.is_symlink() and other.exists()
    lock.unlink()
    chosen = tmp_path / "mine.lock"
    chosen.write_text("")
    logs.remove_job_lock(env | {"SLURMRT_LOCK_FILE": str(chosen)})  # a lock the user chose is theirs to keep
    assert chosen.exists()
