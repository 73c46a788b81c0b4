"""The save helper: a process of its own, below the training's CPU priority, that writes a background save's tensors
from shared memory.

Why a process. A background save written by threads of the training process took 19-29 % of the steps of a loop
of 1 ms busy-Python steps on this machine's 2 cores, even with the writer threads at nice +10; the same writes from
a process at nice +10 took 0-5 % (alternated, 6 rounds each, 1 GiB; ``benchmarks/RESULTS.md``). A thread at low
priority that holds the GIL (torch.save's pickling, the code between two ``write`` calls) and is then preempted
keeps the training thread waiting for the GIL until the scheduler runs it again: priority inversion. A process
has a GIL of its own.

What goes where:

- :class:`SharedBuffers` (training process): the host buffers the :class:`~.sharded.Stager` copies a state into
  are views of anonymous shared memory (``memfd_create``), one segment per layout of the state, reused from one save
  to the next. A segment's file descriptor goes to the helper once, over a Unix socket; a tensor then travels as
  (segment, offset, dtype, shape, strides), never as bytes. A segment dies with the last process that maps it: a
  SIGKILL leaves nothing behind in ``/dev/shm``.
- :class:`Helper` (training process): starts ``python -m slurmrt.checkpoint.helper`` on the first background save
  that has work for it, sends it work and waits, on the save's background thread, for the files it wrote with their
  checksums. No save waits for it to start (it imports torch: seconds): until it is ready, and for good if it cannot
  start, threads of the training process write, as they did before it.
- :func:`main` (the helper): writes each job with the same code as the threads would (:func:`~._files.write_state`,
  DCP's writer through :class:`~._files.Hashing`), and answers. It ignores the signals Slurm and a terminal send to
  every process of a step (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP): the training process decides when to stop,
  and its last save must not lose its writer. It exits when the training process is gone: its socket closes, or
  its parent changes.

Only what the training process cannot hand over as shared tensors stays there: the main file of a state written in
parts (the objects around the tensors, whose classes the helper may not be able to import: a class defined in
``train.py``), the rank-local state, DCP's pickled non-tensor items (pickled on the training side by DCP's planner),
the checksum manifest and the commit. The commit protocol is the same as for a save written by threads.
"""

from __future__ import annotations

import contextlib
import io
import logging
import mmap
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from ._files import FileInfo

__all__ = ["Helper", "SharedBuffers", "available", "main"]

logger = logging.getLogger(__name__)

_ALIGN = 4096
_HEADER = struct.Struct("!Q")
#: Signals the helper ignores: Slurm's warnings and its SIGTERM go to every process of a step, a terminal's ^C to
#: the whole foreground group.
_IGNORED = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


def available() -> bool:
    """Whether this platform has what the helper needs (Linux: ``memfd_create``, and file descriptors passed over a
    Unix socket)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


class _Segment:
    """One block of shared memory: its file descriptor, its mapping, and its address in this process."""

    def __init__(self, ident: int, size: int, fd: int | None = None) -> None:
        self.ident, self.size = ident, size
        self.fd = os.memfd_create(f"slurmrt-stage-{ident}", os.MFD_CLOEXEC) if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, max(size, 1))
        self.map = mmap.mmap(self.fd, max(size, 1))
        import torch

        #: Where the mapping starts in this process (the tensors made over it keep it mapped).
        self.address: int = torch.frombuffer(self.map, dtype=torch.uint8, count=1).data_ptr()

    def storage(self, offset: int, nbytes: int, dtype: Any) -> Any:
        """A 1-D tensor of ``dtype`` over ``nbytes`` at ``offset``, with a storage of its own (``torch.save`` and
        DCP write a tensor's whole storage: one storage for the segment would write all of it for each tensor)."""
        import torch

        if nbytes == 0:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):  # a view still exported: the mapping goes with it
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _storage_bytes(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))) * itemsize


class SharedBuffers:
    """Host buffers in shared memory, for the :class:`~.sharded.Stager`: :meth:`allocate` gives a new set (one
    segment), :meth:`locate` says where a tensor's bytes are."""

    def __init__(self) -> None:
        self.segments: dict[int, _Segment] = {}
        self._next = 0
        self._pinned: set[int] = set()

    def allocate(self, specs: list[tuple[tuple[int, ...], tuple[int, ...], Any]], *, pin: bool = False) -> list[Any]:
        """Empty tensors of these (shape, strides, dtype), in one new segment; the segments before are released
        (their buffers are no longer used: a new set replaces the whole old one)."""
        import torch

        for ident in list(self.segments):
            self.release(ident)
        offsets, size = [], 0
        for shape, stride, dtype in specs:
            offsets.append(size)
            size += -(-_storage_bytes(shape, stride, dtype.itemsize) // _ALIGN) * _ALIGN
        segment = _Segment(self._next, size)
        self._next += 1
        self.segments[segment.ident] = segment
        if pin and size:
            self._pin(segment)
        out = []
        for (shape, stride, dtype), offset in zip(specs, offsets, strict=True):
            nbytes = _storage_bytes(shape, stride, dtype.itemsize)
            out.append(torch.as_strided(segment.storage(offset, nbytes, dtype), shape, stride))
        return out

    def _pin(self, segment: _Segment) -> None:
        """Page-lock the segment for the GPU's copies, as ``pin_memory`` does for a buffer of its own; unpinned
        (slower copies, the same bytes) if CUDA refuses."""
        import torch

        try:
            code = torch.cuda.cudart().cudaHostRegister(segment.address, segment.size, 0)
        except Exception as err:  # noqa: BLE001 - no CUDA runtime: unpinned
            logger.warning("slurmrt: staging memory not pinned (%r): GPU-to-host copies will be slower", err)
            return
        if int(code) != 0:
            logger.warning("slurmrt: staging memory not pinned (cudaHostRegister: %s)", code)
            return
        self._pinned.add(segment.ident)

    def release(self, ident: int) -> None:
        segment = self.segments.pop(ident)
        if ident in self._pinned:
            import torch

            self._pinned.discard(ident)
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(segment.address)
        segment.close()

    def locate(self, tensor: Any) -> tuple[int, int, int] | None:
        """(segment, byte offset of the tensor's storage in it, the storage's bytes) for a tensor whose bytes are in
        one of the segments; None otherwise."""
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        for segment in self.segments.values():
            if segment.address <= address and address + nbytes <= segment.address + segment.size:
                return segment.ident, address - segment.address, nbytes
        return None

    def close(self) -> None:
        for ident in list(self.segments):
            self.release(ident)


class _Pickler(pickle.Pickler):
    """Pickles tensors whose bytes are in shared memory as where they are."""

    def __init__(self, file: Any, buffers: SharedBuffers) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.buffers = buffers

    def persistent_id(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or type(obj) not in (torch.Tensor, torch.nn.Parameter):
            return None
        if obj.device.type != "cpu" or obj.layout != torch.strided or obj.is_quantized:
            return None
        where = self.buffers.locate(obj)
        if where is None:
            return None
        return ("shared", *where, obj.dtype, tuple(obj.shape), tuple(obj.stride()), obj.storage_offset())


class _Unpickler(pickle.Unpickler):
    """Rebuilds the tensors :class:`_Pickler` pickled as views of the segments; views of one storage share it."""

    def __init__(self, file: Any, segments: dict[int, _Segment]) -> None:
        super().__init__(file)
        self.segments = segments
        self.storages: dict[tuple[int, int, int, Any], Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        import torch

        kind, ident, offset, nbytes, dtype, shape, stride, storage_offset = pid
        if kind != "shared":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        key = (ident, offset, nbytes, dtype)
        base = self.storages.get(key)
        if base is None:
            base = self.storages[key] = self.segments[ident].storage(offset, nbytes, dtype)
        return torch.as_strided(base, shape, stride, storage_offset)


def _send(sock: socket.socket, message: Any, buffers: SharedBuffers | None = None) -> None:
    out = io.BytesIO()
    out.write(b"\0" * _HEADER.size)
    (_Pickler(out, buffers) if buffers is not None else pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)).dump(message)
    data = out.getbuffer()
    _HEADER.pack_into(data, 0, len(data) - _HEADER.size)
    sock.sendall(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return data


def _recv(sock: socket.socket, segments: dict[int, _Segment] | None = None) -> Any:
    (n,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    return _Unpickler(io.BytesIO(_recv_exactly(sock, n)), segments or {}).load()


class Helper:
    """The training process's handle on its save helper (see the module). Its methods are called from one thread at a
    time (the store's background save); a helper that died is started again by the next call."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.buffers = SharedBuffers()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._sent: set[int] = set()  # segments the running helper has mapped
        self._failed = False  # it could not be started: not tried again
        self._ready = False  # it said it is ready
        self._spawned = 0.0  # when it was started (time.monotonic())
        #: How long a new helper may take to be ready (it imports torch).
        self.start_timeout_s = 300.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def ready(self) -> bool:
        """Whether the helper is ready for a save now, without waiting: a helper that is not running is started
        (it is ready once it has imported torch, seconds later), and meanwhile the save is written by threads of
        this process, as it is for good if the helper cannot start (with a warning, once)."""
        if self._failed:
            return False
        if self._sock is None or self.pid is None:
            self.close()
            self._spawn()
            return False
        if self._ready:
            return True
        waiting = not select.select([self._sock], [], [], 0)[0]
        if waiting and time.monotonic() - self._spawned < self.start_timeout_s:
            return False
        return self._handshake()

    def start(self) -> bool:
        """Start the helper if it is not running and wait until it is ready (at most :attr:`start_timeout_s`);
        False if it cannot be started."""
        if self.ready() or self._failed:
            return self._ready
        assert self._sock is not None
        select.select([self._sock], [], [], max(0.0, self.start_timeout_s - (time.monotonic() - self._spawned)))
        return self._handshake()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)  # the helper imports this slurmrt, wherever this process found it
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "slurmrt.checkpoint.helper", str(theirs.fileno()), str(self._target_nice()),
                 str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True, env=env,
            )
        except OSError as err:
            ours.close()
            self._fail(err)
            return
        finally:
            theirs.close()
        self._sock, self._sent, self._ready, self._spawned = ours, set(), False, time.monotonic()

    def _handshake(self) -> bool:
        """Read the helper's first message (it is there, or it never came in time): ready, or failed for good."""
        assert self._sock is not None
        try:
            if not select.select([self._sock], [], [], 0)[0]:
                raise TimeoutError(f"not ready after {self.start_timeout_s:.0f} s")
            self._sock.settimeout(10.0)  # the rest of a message that has begun to arrive
            try:
                first = _recv(self._sock)
            finally:
                self._sock.settimeout(None)
            if first != ("ready", os.getpid()):
                raise OSError(f"unexpected first message {first!r}")
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            self._fail(err)
            return False
        self._ready = True
        return True

    def _fail(self, err: BaseException) -> None:
        self.close()
        self._failed = True
        logger.warning("slurmrt: the save helper process could not be started (%r); background saves are "
                       "written by threads of the training process", err)

    def _target_nice(self) -> int:
        """The helper's nice value: the training's (this process's main thread's), plus :attr:`nice`. Absolute,
        because the thread that starts it may already run below the training (it inherits that thread's)."""
        try:
            base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # on Linux, the main thread's
        except OSError:
            base = 0
        return min(19, base + max(0, self.nice))

    def _call(self, op: str, *args: Any) -> Any:
        """Run ``op`` in the helper (started by :meth:`start`); its answer, or its error raised here as a
        CheckpointError."""
        sock = self._sock
        if sock is None or self.pid is None or not self._ready:
            raise CheckpointError("the save helper process is not running")
        try:
            for ident, segment in self.buffers.segments.items():  # each segment's descriptor, once
                if ident not in self._sent:
                    _send(sock, ("segment", ident, segment.size))
                    socket.send_fds(sock, [b"s"], [segment.fd])
                    self._sent.add(ident)
            for ident in self._sent - set(self.buffers.segments):
                _send(sock, ("drop", ident))
                self._sent.discard(ident)
            _send(sock, (op, *args), self.buffers)
            status, value = _recv(sock)
        except (OSError, EOFError) as err:
            code = self._proc.wait() if self._proc is not None else None
            self.close()
            raise CheckpointError(f"the save helper process died while it wrote (exit status {code}; a negative "
                                  f"one is the signal that ended it: -9 is SIGKILL, the kernel's OOM killer's): "
                                  f"{err!r}") from err
        if status == "oserror":  # as an OSError, with its errno: the store's advice for a full disk, a refusal
            code, text = value
            raise OSError(code, f"in the save helper process: {text}")
        if status != "ok":
            raise CheckpointError(f"the save helper process failed: {value}")
        return value

    def write_states(self, directory: Path, states: dict[str, Any]) -> dict[str, FileInfo]:
        """Write each of ``states`` as ``directory/name`` (:func:`~._files.write_state`), each on a thread of its
        own in the helper; the files with their checksums."""
        result: dict[str, FileInfo] = self._call("states", str(directory), states)
        return result

    def write_dcp(self, directory: Path, rank: int, threads: int, plan: Any, data: list[Any]) -> tuple[Any, Any]:
        """DCP's ``write_data`` of this plan in the helper, each item's data resolved here: (its write results, the
        files with their checksums)."""
        result: tuple[Any, Any] = self._call("dcp", str(directory), rank, threads, plan, data)
        return result

    def close(self) -> None:
        """Stop the helper (it exits when its socket closes)."""
        sock, proc, self._sock, self._proc, self._ready = self._sock, self._proc, None, None, False
        if sock is not None:
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def shutdown(self) -> None:
        self.close()
        self.buffers.close()


# -- the helper's side ---------------------------------------------------------------------------------------------
def _states(directory: str, states: dict[str, Any]) -> dict[str, FileInfo]:
    from ._files import write_state

    with ThreadPoolExecutor(max(1, len(states)), thread_name_prefix="slurmrt-helper") as pool:
        infos = list(pool.map(lambda item: write_state(Path(directory) / item[0], item[1]), states.items()))
    return dict(zip(states, infos, strict=True))


def _dcp(directory: str, rank: int, threads: int, plan: Any, data: list[Any]) -> tuple[Any, Any]:
    from . import sharded

    return sharded.write_resolved(Path(directory), rank=rank, threads=threads, plan=plan, data=data)


_OPS: dict[str, Callable[..., Any]] = {"states": _states, "dcp": _dcp}


def _watch_parent(parent: int) -> None:
    """Exit as soon as the training process is gone (a SIGKILL closes no socket that a write in progress reads)."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    fd, nice, parent = (int(a) for a in argv)
    with contextlib.suppress(OSError):  # before any thread: every thread of the helper inherits it
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
    for name in _IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), name="slurmrt-helper-watch", daemon=True).start()
    sock = socket.socket(fileno=fd)
    import torch  # noqa: F401 - ready means ready to write: the import is the helper's start-up

    _send(sock, ("ready", parent))
    segments: dict[int, _Segment] = {}
    while True:
        try:
            message = _recv(sock, segments)
        except (EOFError, ConnectionError):  # the training process closed it, or is gone
            return 0
        op, args = message[0], message[1:]
        if op == "segment":
            _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            segments[args[0]] = _Segment(args[0], args[1], fd=fds[0])
            continue
        if op == "drop":
            segment = segments.pop(args[0], None)
            if segment is not None:
                segment.close()
            continue
        try:
            answer: tuple[str, Any] = ("ok", _OPS[op](*args))
        except OSError as err:  # a full disk, a refused write: its errno goes with it
            answer = ("oserror", (err.errno, f"{err!r}\n{traceback.format_exc()}"))
        except Exception as err:  # noqa: BLE001 - told to the training process, which raises it
            answer = ("error", f"{err!r}\n{traceback.format_exc()}")
        del message, args
        _send(sock, answer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
