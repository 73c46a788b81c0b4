"""A misconfigured launch, said once: when a :class:`~slurmrt.ConfigError` raised by ``init()`` reaches the top of
the script uncaught, the first task of each node prints its one-line message (the value, the rule, the fix) in place
of a traceback through slurmrt's modules, and every task exits with :attr:`ExitCode.CONFIG` (78), which neither
``slurmrt run`` nor the examples' batch scripts requeue. Code that catches the error sees it as before: only the
interpreter's last word on an uncaught error changes."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Mapping
from types import TracebackType

from .._errors import ConfigError
from ..recovery.policy import ExitCode

__all__ = ["arm"]


def arm(error: ConfigError, env: Mapping[str, str]) -> None:
    """Answer ``error`` (and only that error object) this way if nobody catches it."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if value is not error:
            previous(kind, value, trace)
            return
        if first_on_node(env):
            print(f"slurmrt: {kind.__name__}: {value}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said there
                stream.flush()
        atexit._run_exitfuncs()  # the script's own handlers run, as they would after a traceback
        os._exit(ExitCode.CONFIG)

    sys.excepthook = hook


def first_on_node(env: Mapping[str, str]) -> bool:
    """Whether this process is the first task of its node (the launcher's local rank 0). A value that cannot be
    read (the very error being reported, perhaps) counts as first: a message printed twice beats one never printed."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = env.get(name, "").strip()
        if value:
            return not value.isdigit() or int(value) == 0
    return True
