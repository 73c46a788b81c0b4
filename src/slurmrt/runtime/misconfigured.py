"""A misconfiguration, said once: when a :class:`~slurmrt.ConfigError` reaches the top of the script uncaught --
raised by ``init()``, or later by a call that found an option or the launch wrong (``should_stop`` before
``init_process_group``, a checkpoint directory one node does not share) -- the first task of each node prints its
one-line message (the value, the rule, the fix) in place of a traceback through slurmrt's modules, and every task
exits with :attr:`ExitCode.CONFIG` (78), which neither ``slurmrt run`` nor the examples' batch scripts requeue. Code
that catches the error sees it as before: only the interpreter's last word on an uncaught error changes.

The other tasks of the node wait for the first to have said it (a marker in the node's private runtime directory)
before they exit: with ``srun --kill-on-bad-exit``, the first task to exit ends the others, and the first task of
the node could be ended before it said anything. They do not wait for a first task that passed ``init()`` when theirs
failed there (an error of their own: a ``$SLURM_PROCID`` the batch shell expanded is right on task 0 alone): the
first task leaves a second marker as its ``init()`` ends, and they say their error at once. A task that waited
:data:`WAIT_S` in vain says it itself."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from .._errors import ConfigError, UnsafePathError
from .._safefs import parent_pid, process_age, read_capped, runtime_base
from ..launch.slurmvars import launch_key, local_id
from ..recovery.policy import ExitCode

__all__ = ["WAIT_S", "first_on_node", "install", "passed"]

#: How long a task that is not its node's first waits for the first to have said the error.
WAIT_S = 30.0


def install(env: Mapping[str, str]) -> None:
    """From now on, answer every :class:`ConfigError` that reaches the top of the script this way (once per
    process: ``init()`` calls it first thing). Other exceptions go to the hook that was there (Python's, or the one
    torch installs over this one at ``init_process_group``, which calls it)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if not isinstance(value, ConfigError):
            previous(kind, value, trace)
            return
        said = _said_path(env)
        unless = None if _after_init or said is None else said.with_name(f"{said.name}-passed")
        if first_on_node(env) or not _wait_for(said, unless=unless):
            _say(f"slurmrt: {kind.__name__}: {value}")
            _mark(said)
        atexit._run_exitfuncs()  # the script's own handlers run, as they would after a traceback
        os._exit(ExitCode.CONFIG)

    sys.excepthook = hook


_installed = False
_after_init = False


def passed(env: Mapping[str, str]) -> None:
    """``init()`` ended without an error: an error from now on is a later call's, which every task of the node meets
    alike; the node's first task says so to the others, which may have failed in ``init()`` on their own."""
    global _after_init
    _after_init = True
    said = _said_path(env)
    if first_on_node(env) and said is not None:
        _mark(said.with_name(f"{said.name}-passed"))


def _say(line: str) -> None:
    """``line`` on the script's stderr; on the process's own when torch's hook has swapped a buffer in for the
    length of the call (it prints the buffer after this hook returns, and this hook does not return)."""
    stream = sys.stderr
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):
        stream = sys.__stderr__ or stream
    print(line, file=stream)
    for each in (sys.stdout, stream):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said there
            each.flush()


def first_on_node(env: Mapping[str, str]) -> bool:
    """Whether this process is the first task of its node (the launcher's local rank 0). A value that cannot be
    read (the very error being reported, perhaps) counts as first: a message printed twice beats one never printed."""
    for raw in (env.get("LOCAL_RANK"), local_id(env)):
        value = (raw or "").strip()
        if value:
            return not value.isdigit() or int(value) == 0
    return True


def _said_path(env: Mapping[str, str]) -> Path | None:
    """The marker of this launch on this node: its tasks share the job, step, run and parent (slurmstepd, torchrun's
    agent); None when the node's runtime directory is not usable."""
    launch = "-".join((*launch_key(env), *(env.get(name, "") for name in ("SLURMRT_RUN_ATTEMPT",
                                                                          "TORCHELASTIC_RESTART_COUNT"))))
    try:
        return runtime_base(env) / f"misconfigured-{launch}-{os.getppid()}"
    except (OSError, UnsafePathError):
        return None


def _mark(path: Path | None) -> None:
    """Touch ``path`` now and write this process's pid in it (the writer, for :func:`_sibling_wrote`)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_TRUNC, 0o600)
        try:
            os.write(fd, str(os.getpid()).encode())
            os.utime(fd)  # now, also when an earlier launch left it
        finally:
            os.close(fd)


def _wait_for(path: Path | None, *, unless: Path | None = None) -> bool:
    """Whether the node's first task said the error: its marker, touched since this process started (less a
    minute: the tasks start together, not to the second), appeared within :data:`WAIT_S`. False at once when
    ``unless`` (the first task passed ``init()``) is there, written by a task of this launch that still runs."""
    if path is None:
        return False
    since = time.time() - (process_age(os.getpid()) or 0.0) - 60.0
    deadline = time.monotonic() + WAIT_S  # a real wait for another process
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime >= since:
                return True
        if unless is not None and _sibling_wrote(unless, since):
            return False
        time.sleep(0.05)
    return False


def _sibling_wrote(path: Path, since: float) -> bool:
    """Whether ``path`` was touched since ``since`` by a process that still runs under this one's parent: a marker
    an earlier launch left (the same job, step and parent within the minute, as a test's launches have) is not."""
    try:
        if os.stat(path).st_mtime < since:
            return False
        pid = int(read_capped(path, 20))
    except (OSError, ValueError):
        return False
    return parent_pid(pid) == os.getppid()
