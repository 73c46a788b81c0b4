"""The save helper: a process of its own, below the training's CPU priority, that writes a background save's tensors
from shared memory.

Why a process. A background save written by threads of the training process slows a busy-Python training loop
far more than the same writes from a process at the same lowered priority (``benchmarks/RESULTS.md``, "Checkpoint
write and resume"). A thread at low priority that holds the GIL (torch.save's pickling, the code between two
``write`` calls) and is then preempted keeps the training thread waiting for the GIL until the scheduler runs it
again: priority inversion. A process has a GIL of its own.

What goes where:

- :class:`~.shm.SharedBuffers` (training process, :mod:`.shm`): the host buffers the :class:`~.staging.Stager`
  copies a state into are views of anonymous shared memory, one segment per layout of the state, reused from one
  save to the next.
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
import logging
import os
import pickle
import select
import signal
import socket
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
from .._safefs import process_stopped
from ._files import FileInfo
from .shm import SharedBuffers, _recv, _Segment, _send

__all__ = ["STOPPED_GRACE_S", "Helper", "HelperLost", "SharedBuffers", "available", "main"]

logger = logging.getLogger(__name__)

#: How long a helper may stay stopped (SIGSTOP) in the middle of a write before the save gives up on it.
STOPPED_GRACE_S = 5.0
_POLL_S = 0.5
_REST_S = 60.0


class HelperLost(CheckpointError):
    """The helper died or stayed stopped during a write: the caller writes the same files with threads."""


#: Signals the helper ignores: Slurm's warnings and its SIGTERM go to every process of a step, a terminal's ^C to
#: the whole foreground group.
_IGNORED = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")


def available() -> bool:
    """Whether this platform has what the helper needs (Linux: ``memfd_create``, and file descriptors passed over a
    Unix socket)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


class Helper:
    """The training process's handle on its save helper (see the module). Its methods are called from one thread at a
    time (the store's background save); a helper that died is started again by the next call."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.buffers = SharedBuffers()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._sent: set[int] = set()  # segments the running helper has mapped
        self._failed = False  # it could not be started, or was lost: not tried again
        self._lost_once = False  # it died or stopped during a write
        self._ready = False  # it said it is ready
        self._spawned = 0.0  # when it was started (time.monotonic())
        #: How long a new helper may take to be ready (it imports torch).
        self.start_timeout_s = 300.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def lost(self) -> bool:
        """Whether the helper died or stopped during a write (threads write from then on)."""
        return self._lost_once

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

    def _running(self) -> Any:
        """The helper's socket. :class:`HelperLost` when it died since it said it was ready (killed while idle, or
        between a save's choice of it and its write: the save falls back to threads); CheckpointError when it is
        not running at all."""
        if self._ready and self._proc is not None and self._proc.poll() is not None:
            raise self._lost(ProcessLookupError(f"it exited with status {self._proc.returncode} before this write"))
        if self._sock is None or self.pid is None or not self._ready:
            raise CheckpointError("the save helper process is not running")
        return self._sock

    def _call(self, op: str, *args: Any) -> Any:
        """Run ``op`` in the helper (started by :meth:`start`); its answer, or its error raised here as a
        CheckpointError."""
        sock = self._running()
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
            status, value = self._answer(sock)
        except (OSError, EOFError) as err:
            raise self._lost(err) from err
        if status == "oserror":  # as an OSError, with its errno: the store's advice for a full disk, a refusal
            code, text = value
            raise OSError(code, f"in the save helper process: {text}")
        if status != "ok":
            raise CheckpointError(f"the save helper process failed: {value}")
        return value

    def _answer(self, sock: socket.socket) -> Any:
        """The helper's answer, waited for as long as it is alive and running: a helper that exits, or that stays
        stopped (SIGSTOP, a debugger) for STOPPED_GRACE_S, ends the wait (never a wait for ever)."""
        stopped_since: float | None = None
        while not select.select([sock], [], [], _POLL_S)[0]:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise EOFError("the save helper process exited")
            if not process_stopped(proc.pid):
                stopped_since = None
                continue
            stopped_since = stopped_since or time.monotonic()
            if time.monotonic() - stopped_since > STOPPED_GRACE_S:
                raise TimeoutError(f"the save helper process (pid {proc.pid}) has been stopped for "
                                   f"{STOPPED_GRACE_S:.0f} s (SIGSTOP?)")
        sock.settimeout(_REST_S)  # the rest of an answer that has begun to arrive
        try:
            return _recv(sock)
        finally:
            sock.settimeout(None)

    def _lost(self, err: BaseException) -> HelperLost:
        """The helper died or stopped while it wrote: it is ended, and threads of this process write this save and
        every later one (one warning)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # a stopped process never exits by itself; SIGKILL ends it even so
        code = proc.wait() if proc is not None else None
        self.close()
        self._failed = self._lost_once = True
        logger.warning("slurmrt: the save helper process was lost while it wrote (%r; exit status %s, a negative one "
                       "is the signal that ended it: -9 is SIGKILL, the kernel's OOM killer's). This save and the next "
                       "are written by threads of the training process", err, code)
        return HelperLost(f"the save helper process was lost while it wrote: {err!r}")

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
