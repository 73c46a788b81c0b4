"""Files in shared places: another user (``nobody``, through ``setpriv``) or a planted symlink gets no process
signalled, no file overwritten or deleted, and no slurmrt call blocked.

The tests that need a second user run only as root (to become ``nobody``); they are skipped with the reason
otherwise. Each failed on the main before the "nothing lost, nobody in" issue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmrt import _flock, log
from slurmrt._safefs import process_start_time
from slurmrt.cli import main
from slurmrt.launch import health
from slurmrt.record.events import Event, EventLog

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                             reason="a second user is played by `setpriv --reuid=65534`: needs root and setpriv")
ROOT = Path(__file__).resolve().parents[2]


def _as_nobody(*argv: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
                            stdout=subprocess.PIPE, text=True, **kwargs)  # type: ignore[call-overload]


@pytest.fixture
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A /tmp of our own: world-writable and sticky, as /tmp is, and this test's TMPDIR."""
    path = Path(tempfile.mkdtemp(prefix="slurmrt-shared-", dir="/tmp"))
    path.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process of ours that must survive."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


@as_root
def test_slurmrt_signal_refuses_a_process_directory_another_user_created_first(
        shared_tmp: Path, bystander: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]) -> None:
    plant = (f"import os; d = {str(shared_tmp)!r} + '/slurmrt-{os.getuid()}'; os.mkdir(d); os.chmod(d, 0o777); "
             f"os.mkdir(d + '/99'); os.chmod(d + '/99', 0o777); open(d + '/99/{bystander.pid}', 'w').close()")
    assert _as_nobody(sys.executable, "-c", plant).wait() == 0
    assert main(["signal", "TERM", "--job", "99"]) == 2
    assert f"belongs to uid {NOBODY}" in capsys.readouterr().err
    time.sleep(0.2)
    assert _alive(bystander)


def test_slurmrt_signal_refuses_a_symlink_planted_as_the_job_directory_and_deletes_nothing(
        shared_tmp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("experiment.json", "latest", "events-99.jsonl"):
        (ckpt / name).write_text("precious\n")
    base = shared_tmp / f"slurmrt-{os.getuid()}"
    base.mkdir(mode=0o700)
    (base / "99").symlink_to(ckpt)
    assert main(["signal", "USR1", "--job", "99"]) == 2
    assert "is a symlink" in capsys.readouterr().err
    assert sorted(p.name for p in ckpt.iterdir()) == ["events-99.jsonl", "experiment.json", "latest"]


def test_a_process_directory_open_to_others_is_refused(shared_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = shared_tmp / f"slurmrt-{os.getuid()}"
    base.mkdir()
    base.chmod(0o777)
    assert main(["signal", "USR1", "--job", "5"]) == 2
    assert "mode 0777" in capsys.readouterr().err


def test_a_pid_file_whose_pid_now_names_another_process_is_not_signalled(
        shared_tmp: Path, bystander: subprocess.Popen[bytes]) -> None:
    from slurmrt.stop.pidfiles import process_dir

    stale = process_dir("42") / str(bystander.pid)  # a SIGKILLed rank's file; its pid was reused by the bystander
    stale.write_text(json.dumps({"pid": bystander.pid, "start": (process_start_time(bystander.pid) or 0) - 1,
                                 "job": "42"}))
    assert main(["signal", "TERM", "--job", "42"]) == 1  # no process found
    time.sleep(0.2)
    assert _alive(bystander) and not stale.exists()


def test_a_registered_training_process_is_signalled(shared_tmp: Path, tmp_path: Path) -> None:
    got = tmp_path / "got"
    code = ("import signal, sys, time, pathlib\n"
            "from slurmrt.stop.pidfiles import register_process\n"
            f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(got)!r}).touch())\n"
            "assert register_process('43') is not None\n"
            "print('ready', flush=True)\n"
            f"while not pathlib.Path({str(got)!r}).exists():\n    time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    assert main(["signal", "USR1", "--job", "43"]) == 0
    assert proc.wait(timeout=60) == 0 and got.exists()


def test_the_health_probe_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's data")
    victim.chmod(0o600)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / f".slurmrt-health-{os.getpid()}").symlink_to(victim)  # the name the probe used to take
    assert health._writable(shm, "/dev/shm") is None
    assert victim.read_bytes() == b"root's data"


def test_the_event_log_never_appends_through_a_planted_symlink(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "events-7.jsonl").symlink_to(victim)
    EventLog(tmp_path / "events-7.jsonl", job="7", restart=0, rank=0).emit(Event.FRESH_START)
    assert victim.read_text() == "untouched\n"
    assert "is a symlink" in caplog.text


@as_root
def test_another_user_holding_the_event_logs_lock_delays_a_write_by_a_bounded_time(
        shared_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_tmp / "events-8.jsonl"
    EventLog(path, job="8", restart=0, rank=0).emit(Event.FRESH_START)
    holder = _as_nobody(sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                        "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(path))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr("slurmrt.record.events.LOCK_TIMEOUT_S", 0.3)
        log_ = EventLog(path, job="8", restart=0, rank=0)
        log_.emit(Event.RESUME, step=3)
        log_.emit(Event.RESUME, step=4)  # given up once: no second wait
    finally:
        holder.kill()
        holder.wait()
    assert [json.loads(line).get("step") for line in path.read_text().splitlines()] == [None, 3, 4]


@as_root
def test_another_users_lock_file_cannot_block_printflock_outside_slurm(shared_tmp: Path) -> None:
    old_name = shared_tmp / f"slurmrt-{os.getuid()}.lock"  # the fixed name printflock locked before
    holder = _as_nobody(sys.executable, "-c", "import fcntl, os, sys, time; "
                        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666); os.fchmod(fd, 0o666); "
                        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(old_name))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMRT"))}
        out = subprocess.run([sys.executable, "-c", "from slurmrt import printflock; printflock('hello')"],
                             env={**env, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(shared_tmp)},
                             capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 0 and out.stdout.strip().endswith("hello"), out.stderr


@contextlib.contextmanager
def _lock_held_elsewhere(lock_file: Path) -> Iterator[Callable[[], None]]:
    """Another process holds an exclusive flock on ``lock_file`` (the file appended to, never truncated) inside the
    block; the block is given a function that makes it exit and so release the lock."""
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()",
                               str(lock_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def release() -> None:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()  # the holder exits: its lock goes with it
        assert holder.wait(30) == 0

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield release
    finally:
        holder.kill()
        holder.wait()
        _flock._lock_fds.pop(str(lock_file), None)


def test_a_lock_held_elsewhere_for_long_is_given_up_and_the_line_still_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lock_file = tmp_path / "job.lock"
    with _lock_held_elsewhere(lock_file):
        monkeypatch.setattr(_flock, "LOCK_TIMEOUT_S", 0.3)
        log.printflock("first", lock_path=lock_file)  # queued: the calls return while the lock is held
        log.printflock("second", lock_path=lock_file)
        assert capsys.readouterr().out == ""
        log.flush()  # what the exit does: waits LOCK_TIMEOUT_S, then writes them without the lock
        log.printflock("third", lock_path=lock_file)  # the lock is not waited for again
    captured = capsys.readouterr()
    assert captured.out.split("\n")[:3] == [f"{log._prefix()} {w}" for w in ("first", "second", "third")]
    assert captured.err.count("written without it") == 1


def test_a_queued_line_older_than_the_timeout_gives_the_lock_up_at_the_next_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lock_file = tmp_path / "job.lock"
    clock = [1000.0]
    monkeypatch.setattr(_flock, "_monotonic", lambda: clock[0])
    with _lock_held_elsewhere(lock_file):
        log.printflock("first", lock_path=lock_file)
        clock[0] += _flock.LOCK_TIMEOUT_S + 1
        log.printflock("second", lock_path=lock_file)  # the first has waited too long: both written now
        captured = capsys.readouterr()
    assert captured.out.split("\n")[:2] == [f"{log._prefix()} first", f"{log._prefix()} second"]
    assert captured.err.count("written without it") == 1


def test_a_lock_held_briefly_elsewhere_is_waited_for_and_the_line_written_under_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock_file = tmp_path / "job.lock"
    with _lock_held_elsewhere(lock_file) as release:
        log.printflock("waited", lock_path=lock_file)  # returns at once: the line waits, not the caller
        log.printflock("in order", lock_path=lock_file)
        time.sleep(0.5)
        assert capsys.readouterr().out == "", "written while another process held the lock"
        release()
        log.flush(timeout_s=60)
    captured = capsys.readouterr()
    assert captured.out.split("\n")[:2] == [f"{log._prefix()} waited", f"{log._prefix()} in order"]
    assert "written without it" not in captured.err


def test_a_handlers_lines_to_its_own_file_never_wait_for_a_lock_another_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    logger = logging.getLogger("slurmrt-test-behind")
    logger.propagate = False
    with _lock_held_elsewhere(path) as release:
        handler = log.install(logging.INFO, path=path, logger=logger)
        handler.setFormatter(logging.Formatter("%(message)s"))
        try:
            for i in range(100):
                logger.info("line %d", i)  # returns at once: the lines wait for the lock, not the caller
            time.sleep(0.5)
            assert path.read_text() == "", "written while another process held the lock"
            release()
            handler.close()  # waits for the lines written behind, then closes the file
        finally:
            logger.removeHandler(handler)
    assert path.read_text().splitlines() == [f"{log._prefix()} line {i}" for i in range(100)]


def test_a_lock_descriptor_that_fails_gives_the_lock_up_and_the_lines_are_still_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fd = os.open(tmp_path / "job.lock", os.O_RDWR | os.O_CREAT)
    os.close(fd)  # the queue's thread gets EBADF from flock
    queue = _flock._Queue(fd, str(tmp_path / "job.lock"))
    queue.put("one\n", sys.stdout)
    queue.put("two\n", sys.stdout)
    queue.flush(60)  # returns once the thread gave up and wrote them, long before the timeout
    captured = capsys.readouterr()
    assert captured.out == "one\ntwo\n"
    assert "cannot be taken" in captured.err and "written without it" in captured.err


def test_a_line_put_on_a_queue_already_given_up_is_written_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fd = os.open(tmp_path / "job.lock", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    queue = _flock._Queue(fd, str(tmp_path / "job.lock"))
    queue.give_up("was given up by a test")  # as when the thread gave up between a caller's lookup and its put
    queue.put("late\n", sys.stdout)
    assert capsys.readouterr().out == "late\n"


@as_root
def test_a_lease_lock_another_user_planted_as_a_link_is_refused_naming_the_link_and_its_owner(
        shared_tmp: Path) -> None:
    """A shared checkpoint directory (sticky and world-writable, as a group's scratch may be): another user plants the
    lease's lock file as a link to one of ours. Linux refuses our O_CREAT open of their link with EACCES, which read
    as 'the directory must be writable by the job': the refusal names the link and its owner, and nothing is
    written through it."""
    from slurmrt._errors import LeaseError
    from slurmrt.checkpoint.lease import Lease

    ckpt = shared_tmp / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o1777)
    victim = shared_tmp / "victim"
    victim.write_text("ours\n")
    plant = f"import os; os.symlink({str(victim)!r}, {str(ckpt / '.slurmrt-lease.lock')!r})"
    assert _as_nobody(sys.executable, "-c", plant).wait() == 0
    with pytest.raises(LeaseError) as refused:
        Lease(ckpt, owner="job 7", job="7", run="r", step="0").acquire()
    said = str(refused.value)
    assert ".slurmrt-lease.lock is a symlink, owned by uid 65534" in said or \
        ".slurmrt-lease.lock is a symlink, owned by user nobody" in said, said
    assert "must be writable" not in said and victim.read_text() == "ours\n"
