"""The launcher that started this process (torchrun, ``accelerate launch``): its command line, read from /proc, and
the rendezvous it asked for. Apart from :mod:`slurmrt.launch.topology`, which stays pure (it reads only the
environment mapping it is given): init() reads /proc here and hands the command line over.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["launcher_argv", "rendezvous_backend"]


def rendezvous_backend(argv: Sequence[str] | None) -> str | None:
    """The rendezvous backend on a torchrun or ``accelerate launch`` command line: the value of ``--rdzv-backend``
    (``--rdzv_backend``), ``"static"`` when the option is absent (both launchers' default), ``"c10d"`` for
    torchrun's ``--standalone``; None when ``argv`` is unknown."""
    if argv is None:
        return None
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--rdzv-backend", "--rdzv_backend"):
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else None
        if arg == "--standalone":
            return "c10d"
    return "static"


def launcher_argv(pid: int | None = None, *, depth: int = 3) -> list[str] | None:
    """The command line of the nearest ancestor of ``pid`` (default: this process) that is torchrun or
    ``accelerate launch``, read from /proc; None when there is none or /proc cannot tell."""
    current = os.getpid() if pid is None else pid
    for _ in range(depth):
        try:
            with open(f"/proc/{current}/stat", "rb") as f:
                current = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{current}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except (OSError, ValueError, IndexError):
            return None
        text = " ".join(argv[:3])
        if "torchrun" in text or "torch.distributed.run" in text or "torch.distributed.launch" in text \
                or "accelerate" in text:
            return argv
    return None
