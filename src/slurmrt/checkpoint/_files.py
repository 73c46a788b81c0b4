"""Durable writes: a file, a directory entry or a whole tree is on disk (fsync) before the commit relies on it. And
the content checksum the manifest carries for every file: XXH3-64 (several times CRC-32's speed), computed as the
bytes are written where slurmrt writes them (torch.save, DCP's files), else read back while
they are still in the page cache (what a save function wrote).

The disk starts on a file's bytes while the rest are still being serialized and hashed: every
:data:`WRITEBACK_BYTES` written, :class:`Hashing` asks the kernel to begin writing them back
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait). A checkpoint file of less than a tenth of the
machine's memory stays under the kernel's background writeback threshold (``vm.dirty_background_ratio``), so without
the hint nothing goes to the disk before the final ``fsync``: the copies into the page cache, the pickling and the
checksum, then all of the disk's work, in series. With it the two overlap (``benchmarks/RESULTS.md``, "Checkpoint
write and resume"). The
``fsync`` stays what makes a file durable; the hint only moves the disk's work earlier, and a file system that
refuses it is written as before."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from .._safefs import fsync_dir, leftover_tmp_files, replace_text, write_text

__all__ = ["HASH", "WRITEBACK_BYTES", "FileInfo", "Hashing", "checksum_files", "failure_advice", "free_space",
           "fsync_dir", "fsync_tree", "hash_file", "leftover_tmp_files", "make_own_dir", "no_zip_crc", "replace_text",
           "start_writeback", "write_state", "write_text"]

#: The manifest's name for the checksum, the key of its value in each file's entry.
HASH = "xxh3_64"
#: name -> {"size": bytes, HASH: "16 hex digits"}: one entry of a manifest's "files".
FileInfo = dict[str, Any]
_CHUNK = 16 << 20
#: How many bytes a :class:`Hashing` writes before it asks the kernel to start writing them back.
WRITEBACK_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of the range's dirty pages, wait for nothing

#: ``start(fd, offset, nbytes)``: begin the writeback of that range of a file, without waiting for it.
StartWriteback = Callable[[int, int, int], None]


@functools.cache
def start_writeback() -> StartWriteback | None:
    """libc's ``sync_file_range`` with ``SYNC_FILE_RANGE_WRITE`` (Linux; Python's ``os`` does not have it), raising
    ``OSError`` when the call fails; None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        if fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) != 0:  # ctypes releases the GIL for the call
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return start


_DEFAULT: Any = object()


class Hashing:
    """A write-only file object that hashes what goes through it to the file it wraps (torch.save writes to any
    object with ``write``; DCP's writer also asks ``tell`` and ``fileno``), in pieces of 16 MiB, and has the disk
    start on every :data:`WRITEBACK_BYTES` written (see the module). ``writeback``: the call that starts it, by
    default :func:`start_writeback`; None for none."""

    def __init__(self, f: Any, *, writeback: StartWriteback | None = _DEFAULT) -> None:
        import xxhash

        self._f, self._h, self.size = f, xxhash.xxh3_64(), 0
        self._writeback: StartWriteback | None = start_writeback() if writeback is _DEFAULT else writeback
        self._fd = self._base = self._asked = 0  # the file, where this stream began in it, the bytes asked so far
        if self._writeback is not None:
            try:
                self._fd, self._base = f.fileno(), f.tell()
            except (OSError, AttributeError, ValueError):  # not a file of the OS (io.UnsupportedOperation included)
                self._writeback = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for i in range(0, view.nbytes, _CHUNK):
            piece = view[i:i + _CHUNK]
            self._h.update(piece)
            self.size += piece.nbytes
            while piece.nbytes:  # a raw (unbuffered) file may take less than it was given
                written = self._f.write(piece)
                if written == 0:  # no progress and no error: fail rather than spin forever
                    raise OSError(f"{self._f!r} took none of {piece.nbytes} bytes")
                piece = piece[piece.nbytes if written is None else written:]  # None: a file-like that took it all
            if self._writeback is not None and self.size - self._asked >= WRITEBACK_BYTES:
                self._start_disk()
        return view.nbytes

    def _start_disk(self) -> None:
        # The range may end in bytes a buffered file still holds: pages that are not dirty yet are skipped, and
        # the final fsync writes whatever no hint did.
        assert self._writeback is not None
        try:
            self._writeback(self._fd, self._base + self._asked, self.size - self._asked)
        except OSError:
            self._writeback = None  # refused by this file system: the fsync alone, as without the hint
        self._asked = self.size

    def info(self) -> FileInfo:
        return {"size": self.size, HASH: self._h.hexdigest()}

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return int(self._f.tell())

    def fileno(self) -> int:
        return int(self._f.fileno())

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self._f.close()


def write_state(path: Path, state: dict[str, Any]) -> FileInfo:
    import torch

    with open(path, "wb") as f:
        out = Hashing(f)
        with no_zip_crc():
            torch.save(state, out)  # type: ignore[arg-type]  # any object with write()
        f.flush()
        os.fsync(f.fileno())
        return out.info()


_crc_lock = threading.Lock()
_crc_users = 0  # slurmrt writes running now (where torch's option is the process's)
_crc_saved = True  # torch's option as the first of them found it


@contextlib.contextmanager
def no_zip_crc() -> Iterator[None]:
    """torch.save without its zip CRC-32 of every record (a quarter of its time), in the thread that enters:
    slurmrt's XXH3 of the same bytes, in the manifest, already tells a damaged file. torch.load reads such a file as
    any other.

    Newer torch (2.13 here) keeps the option per thread, as all of its serialization config: it is turned off for
    this thread and put back after, and each writer thread (DCP's included, see :mod:`.sharded`) must enter on its
    own. Where it is the process's, it is turned off while any slurmrt write runs and put back after the last one, so
    a torch.save of the program's own running meanwhile may write a file without CRCs, which it loads all the
    same."""
    global _crc_users, _crc_saved
    from torch import serialization

    if not hasattr(serialization, "set_crc32_options"):  # a torch without the option: its CRC stays
        yield
        return
    if _crc_option_per_thread():
        saved = serialization.get_crc32_options()
        serialization.set_crc32_options(False)
        try:
            yield
        finally:
            serialization.set_crc32_options(saved)
        return
    with _crc_lock:
        if _crc_users == 0:
            _crc_saved = serialization.get_crc32_options()
            serialization.set_crc32_options(False)
        _crc_users += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_users -= 1
            if _crc_users == 0:
                serialization.set_crc32_options(_crc_saved)


@functools.cache
def _crc_option_per_thread() -> bool:
    """Whether torch's CRC option is a thread's own: a thread of ours sets it, and this one looks. (Where it is the
    process's, it is put back at once, under the lock the writes take.)"""
    from torch import serialization

    with _crc_lock:
        before = serialization.get_crc32_options()
        probe = threading.Thread(target=serialization.set_crc32_options, args=(not before,))
        probe.start()
        probe.join()
        if serialization.get_crc32_options() == before:
            return True
        serialization.set_crc32_options(before)
        return False


def hash_file(path: Path) -> FileInfo:
    import xxhash

    h, size = xxhash.xxh3_64(), 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return {"size": size, HASH: h.hexdigest()}


def checksum_files(root: Path, names: Iterable[str], *, threads: int = 4) -> dict[str, FileInfo]:
    """The size and checksum of each file, read back, several files at a time."""
    names = sorted(names)
    if len(names) <= 1 or threads <= 1:
        return {n: hash_file(root / n) for n in names}
    with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="slurmrt-hash") as pool:
        return dict(zip(names, pool.map(lambda n: hash_file(root / n), names), strict=True))










def fsync_tree(root: Path) -> list[str]:
    """fsync every file and directory under ``root``; the files' paths relative to it."""
    names: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath) / name
            with open(full, "rb") as f:
                os.fsync(f.fileno())
            names.append(str(full.relative_to(root)))
        fsync_dir(Path(dirpath))
    return names


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def failure_advice(err: BaseException, root: Path) -> str:
    """The fix for the errors whose fix is known (a full disk, a refused write); nothing for the others -- a bug in
    a saver is not cured by freeing space. torch.save turns a full disk into "unexpected pos": that counts too."""
    if isinstance(err, OSError) and err.errno in _FULL or "unexpected pos" in str(err):
        return f"; fix: free space (or raise the quota) in {root}"
    if isinstance(err, OSError) and err.errno in _DENIED:
        return f"; fix: let the job write to {root} (permissions, a read-only mount)"
    return ""


def free_space(path: Path) -> str:
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**30:.2f} GiB free in {path}"


def make_own_dir(path: Path) -> None:
    """The save's temporary directory, made by whichever rank comes first; refused unless it is a directory of this
    user's (not a link, not another user's planted under the name, whose links the save would write through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise CheckpointError(f"{path} exists and is not a directory this user made (owner uid {st.st_uid}): "
                              "someone else put it there. The save writes nothing through it; remove it",
                              path=str(path))
