"""The checkpoint files' writer (slurmrt.checkpoint._files.Hashing): every byte it is given reaches the file and
its checksum, and the disk is asked to start on the bytes as they are written, never instead of the fsync."""

from __future__ import annotations

import errno
import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrt.checkpoint import _files
from slurmrt.checkpoint._files import HASH, Hashing, start_writeback, write_state


class Recorder:
    """A writeback call that records what it was asked (and can refuse, as some file systems do)."""

    def __init__(self, refuse: int | None = None) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.refuse = refuse

    def __call__(self, fd: int, offset: int, nbytes: int) -> None:
        self.calls.append((fd, offset, nbytes))
        if self.refuse is not None:
            raise OSError(self.refuse, os.strerror(self.refuse))


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 7 bytes and a hint every 11: the logic of 16 MiB and 8 MiB, on bytes a test can afford."""
    monkeypatch.setattr(_files, "_CHUNK", 7)
    monkeypatch.setattr(_files, "WRITEBACK_BYTES", 11)


def _through(path: Path, chunks: list[bytes], writeback: Any, *, prefix: bytes = b"") -> Hashing:
    with open(path, "wb") as f:
        f.write(prefix)
        f.flush()
        out = Hashing(f, writeback=writeback)
        for chunk in chunks:
            assert out.write(chunk) == len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return out


@pytest.mark.usefixtures("small_pieces")
@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(max_size=40), max_size=12))
def test_every_byte_reaches_the_file_and_the_checksum_in_whatever_pieces_it_comes(
        tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("h") / "f"
    out = _through(path, chunks, Recorder())
    data = b"".join(chunks)
    assert path.read_bytes() == data
    assert out.info() == {"size": len(data), HASH: xxhash.xxh3_64(data).hexdigest()}


@pytest.mark.usefixtures("small_pieces")
@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.binary(max_size=40), max_size=12), prefix=st.binary(max_size=20))
def test_the_disk_is_asked_for_each_stretch_once_in_order_from_where_the_stream_began(
        tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], prefix: bytes) -> None:
    path = tmp_path_factory.mktemp("h") / "f"
    hint = Recorder()
    out = _through(path, chunks, hint, prefix=prefix)
    end = len(prefix)
    for fd, offset, nbytes in hint.calls:
        assert fd > 2, "the file's own descriptor"
        assert offset == end, "contiguous, from where this stream began in the file"
        assert nbytes >= _files.WRITEBACK_BYTES, "never a hint per small write"
        end += nbytes
    assert end <= len(prefix) + out.size
    assert len(prefix) + out.size - end < _files.WRITEBACK_BYTES, "all but the last stretch was asked for"


@pytest.mark.usefixtures("small_pieces")
def test_a_file_system_that_refuses_the_hint_is_asked_once_and_written_whole(tmp_path: Path) -> None:
    hint = Recorder(refuse=errno.ESPIPE)
    chunks = [bytes(range(30))] * 5
    out = _through(tmp_path / "f", chunks, hint)
    assert len(hint.calls) == 1
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    assert out.size == 150


def test_a_file_like_without_a_descriptor_is_hashed_without_the_hint() -> None:
    buf = io.BytesIO()
    out = Hashing(buf, writeback=Recorder(refuse=errno.EBADF))  # would fail the write if it were ever called
    out.write(b"x" * (_files.WRITEBACK_BYTES + 1))
    assert buf.getvalue() == b"x" * (_files.WRITEBACK_BYTES + 1)


@pytest.mark.usefixtures("small_pieces")
def test_a_raw_file_that_takes_fewer_bytes_than_given_still_gets_all_of_them(tmp_path: Path) -> None:
    class Stingy:  # an unbuffered file may write less than it is given, and say how much
        def __init__(self, raw: Any) -> None:
            self.raw = raw

        def write(self, data: Any) -> int:
            return int(self.raw.write(bytes(data)[:3]))

        def fileno(self) -> int:
            return int(self.raw.fileno())

        def tell(self) -> int:
            return int(self.raw.tell())

    data = bytes(range(256)) * 3
    with open(tmp_path / "f", "wb", buffering=0) as raw:
        out = Hashing(Stingy(raw), writeback=Recorder())
        assert out.write(data) == len(data)
    assert (tmp_path / "f").read_bytes() == data
    assert out.info()[HASH] == xxhash.xxh3_64(data).hexdigest()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_on_linux_the_hint_is_libcs_sync_file_range_and_reports_its_errors() -> None:
    start = start_writeback()
    assert start is not None
    with pytest.raises(OSError) as got:
        start(-1, 0, 1)
    assert got.value.errno == errno.EBADF


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_a_state_written_with_the_real_hint_loads_back_equal_with_its_checksum(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    real = start_writeback()
    assert real is not None
    asked: list[int] = []

    def counting(fd: int, offset: int, nbytes: int) -> None:
        real(fd, offset, nbytes)
        asked.append(nbytes)

    monkeypatch.setattr(_files, "start_writeback", lambda: counting)
    state = {"w": torch.arange(6 << 20, dtype=torch.float32), "step": 3}  # 24 MiB: several hints
    info = write_state(tmp_path / "s.pt", state)
    assert len(asked) >= 2
    data = (tmp_path / "s.pt").read_bytes()
    assert info == {"size": len(data), HASH: xxhash.xxh3_64(data).hexdigest()}
    loaded = torch.load(tmp_path / "s.pt", weights_only=False)
    assert loaded["step"] == 3 and torch.equal(loaded["w"], state["w"])


def test_a_file_that_takes_no_bytes_and_raises_nothing_fails_the_write_instead_of_spinning() -> None:
    class Stuck:
        def write(self, data: Any) -> int:
            return 0

    with pytest.raises(OSError, match="took none of 5 bytes"):
        Hashing(Stuck(), writeback=None).write(b"12345")
