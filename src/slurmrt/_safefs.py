"""Files in shared places are hostile until proven otherwise.

``/tmp``, ``/dev/shm`` and a group-writable checkpoint directory are places another user can write to first. Every
file slurmrt creates there is created here: directories by us, mode 0700, checked for owner, mode and symlink before
use (as OpenSSH and systemd treat per-user runtime directories); files with ``O_EXCL``/``O_NOFOLLOW``, so that a
symlink planted under the name is refused instead of followed; locks taken with a bound, so that another user who
holds a lock on a file they can open never blocks a slurmrt call.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ._errors import UnsafePathError

__all__ = ["NotOwnError", "fsync_dir", "group_id", "leftover_tmp_files", "lock", "locked_file", "open_append",
           "open_new", "open_regular", "private_dir", "process_start_time", "process_stopped", "read_capped",
           "remove_entry", "replace_text", "runtime_base", "write_text"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _check_private(path: Path, st: os.stat_result) -> None:
    """Refuse ``path`` (lstat ``st``) unless it is a real directory of ours that nobody else may write to."""
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(
            f"{path} is a symlink (to {os.readlink(path)!r}); slurmrt keeps its runtime files in a directory it "
            "created itself. Remove the link (someone else may have planted it), or point TMPDIR elsewhere",
            path=str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} is not a directory: remove it, or point TMPDIR elsewhere", path=str(path))
    if st.st_uid != uid:
        raise UnsafePathError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {uid}): another user created it first, so "
            "the files in it cannot be trusted. Ask them or an administrator to remove it, or point TMPDIR "
            "elsewhere", path=str(path), owner=st.st_uid)
    if st.st_mode & 0o077:
        raise UnsafePathError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may write or read in it. slurmrt creates it "
            f"with 0700; fix it with `chmod 700 {path}` (or remove it)", path=str(path),
            mode=stat.S_IMODE(st.st_mode))


def private_dir(path: Path) -> Path:
    """``path`` as a directory of this user's, mode 0700: created if absent (its parent must exist), checked if
    present. :class:`~slurmrt.UnsafePathError` when it is a symlink, not ours, or open to others."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    _check_private(path, os.lstat(path))
    return path


def runtime_base(env: Mapping[str, str] | None = None) -> Path:
    """This user's private runtime directory on this node: ``$XDG_RUNTIME_DIR/slurmrt`` when that directory exists
    and is ours (systemd creates it per user, 0700), else ``$TMPDIR/slurmrt-<uid>`` (under Slurm, the job's own
    tmp when the cluster gives one). Created 0700 and checked (:func:`private_dir`)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            _check_private(Path(xdg), os.lstat(xdg))
        except (OSError, UnsafePathError):
            pass  # propagated by srun from a login node where it existed: not usable here
        else:
            return private_dir(Path(xdg) / "slurmrt")
    tmp = env.get("TMPDIR") or tempfile.gettempdir()
    return private_dir(Path(tmp) / f"slurmrt-{os.getuid()}")


def group_id(group: str | None) -> int | None:
    """The gid of ``group`` (a name or a number); None for None. ValueError when no such group exists."""
    if group is None:
        return None
    try:
        return grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no group {group!r} on this node (see `getent group`)") from None


def open_new(path: Path, mode: int = 0o600) -> int:
    """A new file, for writing: refused (FileExistsError) when the name exists, a symlink included."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


def open_append(path: Path, mode: int = 0o644, *, own: bool = False) -> int:
    """``path`` opened for appending, created if absent; a symlink there is refused (never followed), and so is
    anything but a regular file (a FIFO would block the writer until someone reads it): UnsafePathError, an
    OSError."""
    return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode, own=own)


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o644, *, own: bool = False) -> int:
    """``path`` opened as a regular file and nothing else: a symlink is refused, never followed; a FIFO, socket or
    device planted under the name is refused without blocking on it (O_NONBLOCK, then fstat). ``own``: the file
    must be this user's too (checked on the open descriptor): a record another user left where the job writes (a
    sticky, world-writable directory) is refused, :class:`NotOwnError`. The descriptor is blocking again when
    returned. :class:`~slurmrt.UnsafePathError` names the file and what it is."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EACCES, errno.EPERM):
            _refuse_planted(path, err)
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path} is not a regular file (it is a {_kind(st.st_mode)}); slurmrt never opens "
                              "anything else there, since reading a FIFO or a device may block for ever or never "
                              "end: remove it", path=str(path))
    if own and st.st_uid != os.geteuid():
        os.close(fd)
        raise NotOwnError(f"{path} belongs to {_owner(st.st_uid)}, not to you: slurmrt believes only its own "
                          "records (another user may have left it where your job writes): ignored. Remove it, or "
                          "point the job at a directory of your own", path=str(path))
    os.set_blocking(fd, True)
    return fd


def _refuse_planted(path: Path | str, err: OSError) -> None:
    """Raise :class:`UnsafePathError` naming what is at ``path`` and whose it is, when that is why the open failed:
    a symlink (ELOOP; or EACCES, which Linux gives an O_CREAT open of another user's link in a sticky directory) or
    another user's file (EACCES under ``fs.protected_regular``). A plain EACCES (a directory the job cannot write)
    returns: the caller says that."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    owner = "" if st.st_uid == os.geteuid() else f", owned by {_owner(st.st_uid)}"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink{owner}; slurmrt reads and writes its files only as files of their "
                              "own, never through a link (someone else may have planted it): remove it",
                              path=str(path)) from None
    if owner and err.errno != errno.ELOOP:
        raise NotOwnError(f"{path} is a {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'file'}{owner}, "
                          f"not you, and cannot be opened ({err.strerror}): another user may have left it where your "
                          "job writes (a sticky, world-writable directory). Remove it, or point the job at a "
                          "directory of your own", path=str(path)) from None


class NotOwnError(UnsafePathError):
    """A record (an event log, the bad-node ledger) that another user owns: never believed."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


def read_capped(path: Path | str, limit: int, *, own: bool = False) -> bytes:
    """The whole of the regular file ``path`` (:func:`open_regular`), which must hold at most ``limit`` bytes: a
    file that grows without end (a link to /dev/zero is refused already) or was made huge is refused with
    :class:`~slurmrt.UnsafePathError`, not read into memory."""
    fd = open_regular(path, own=own)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafePathError(f"{path} holds more than {limit} bytes, far more than slurmrt ever writes there: not "
                              "read. Look at what it is, and remove it", path=str(path))
    return data


def remove_entry(path: Path) -> None:
    """Remove ``path`` without following or opening anything that is not a directory of its own: a directory tree
    is removed (``rmtree`` never follows the links inside), anything else (a file, a link, a FIFO) is unlinked.
    Errors are ignored (best effort, as a clean-up is)."""
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def lock(fd: int, *, timeout_s: float, shared: bool = False) -> bool:
    """``flock`` ``fd`` within ``timeout_s``; False when someone else held it all that time (anyone who can open a
    file can lock it, so no wait may be unbounded)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    operation = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    while True:
        try:
            fcntl.flock(fd, operation)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on); none when there is no such process.
    The command name (field 2) is in parentheses and may hold spaces or ')': split after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return []
    return data[data.rfind(b")") + 2:].split()


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (field 4 of ``/proc/<pid>/stat``); None when there is no such process."""
    fields = _proc_stat(pid)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of ``/proc/<pid>/stat``); None when
    there is no such process. With the pid it names one process, even after the pid is reused."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_age(pid: int) -> float | None:
    """How long ago process ``pid`` started, in seconds (boot-time clock: no wall clock step moves it); None when
    it cannot be read (no /proc)."""
    start = process_start_time(pid)
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if start is None else max(0.0, uptime - start / os.sysconf("SC_CLK_TCK"))


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T or t: SIGSTOP, a debugger)."""
    fields = _proc_stat(pid)
    return bool(fields) and fields[0] in (b"T", b"t")


@contextlib.contextmanager
def locked_file(path: Path, *, timeout_s: float, mode: int = 0o644) -> Iterator[None]:
    """Hold the flock of the lock file ``path`` (created if absent, a regular file only: :func:`open_regular`),
    waited for at most ``timeout_s``; :class:`TimeoutError` when someone held it all that time."""
    fd = open_regular(path, os.O_RDONLY | os.O_CREAT, mode)
    try:
        if not lock(fd, timeout_s=timeout_s):
            raise TimeoutError(f"{path} stayed locked for {timeout_s:.0f} s")
        yield
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def replace_text(path: Path, text: str) -> None:
    """Replace ``path`` whole, durably: a reader (or a run after a SIGKILL) sees the old text or the new one. The
    temporary file is new (O_EXCL, never through a planted symlink) and gone when this returns, whatever happened;
    one a SIGKILL left is named ``.<name>.<pid>.<random>.tmp`` (see :func:`leftover_tmp_files`)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = open_new(tmp, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def leftover_tmp_files(directory: Path, name: str) -> list[Path]:
    """The temporary files of :func:`replace_text` for ``directory/name`` that a killed writer left behind."""
    return [p for p in directory.glob(f".{name}.*.tmp") if not p.is_dir()]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
