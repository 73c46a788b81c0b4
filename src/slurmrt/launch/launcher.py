"""The launcher that started this process (torchrun, ``accelerate launch``): its command line, read from /proc, and
the rendezvous it asked for. Apart from :mod:`slurmrt.launch.topology`, which stays pure (it reads only the
environment mapping it is given): init() reads /proc here and hands the command line over.

A launcher is recognised the way the interpreter would read its command line, whatever wrote it: ``torchrun``,
``python -u -m torch.distributed.run``, ``python3 -X faulthandler -m torch.distributed.launch``, ``python -m
accelerate.commands.launch``, ``accelerate launch``, behind ``env A=B`` or ``uv run``, or as a console script under
any name or path (its few lines name the module it runs). ``bash -c`` wrappers need nothing: the launcher runs as a
process of its own between them and the training process.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

from .._safefs import parent_pid

__all__ = ["find_launcher", "identify", "launcher_argv", "python_target", "rendezvous_backend"]

# The modules a launcher runs, and the word after the program that makes `accelerate` a launch.
_LAUNCHER_MODULES = {"torch.distributed.run": None, "torch.distributed.launch": None,
                     "accelerate.commands.launch": None, "accelerate.commands.accelerate_cli": "launch"}
_LAUNCHER_PROGRAMS = {"torchrun": None, "accelerate": "launch"}
# A console script written by pip or uv: `from torch.distributed.run import main`.
_CONSOLE_SCRIPT = re.compile(rb"^from ([\w.]+) import main\s*$", re.M)
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")

# CPython's options (`python --help`): those without a value, which may be bundled (-uB), and those that take one,
# attached (-Xfaulthandler) or as the next word (-X faulthandler).
_PY_FLAGS = frozenset("bBdEhiIOPqRsSuvVx?")
_PY_VALUED = frozenset("XW")
_PY_LONG_VALUED = frozenset({"--check-hash-based-pycs"})

# Programs that run the command after their own words: `env A=B cmd`, `uv run [opts] cmd`, `conda run -n x cmd`.
_ENV_VALUED = frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"})
_RUNNERS = {"uv": "run", "conda": "run", "mamba": "run", "micromamba": "run", "pixi": "run", "poetry": "run"}


def python_target(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """What a ``python`` command line runs: ``("module", name, args)`` for ``-m``, ``("script", path, args)`` for a
    script, ``("command", code, args)`` for ``-c``; None for stdin, an unknown option or no target. ``argv[0]`` is
    the interpreter."""
    # Shape: python's own argument scan: one case per kind of word, in the interpreter's order
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return ("script", argv[i + 1], list(argv[i + 2:])) if i + 1 < len(argv) else None
        if word.startswith("--"):
            name = word.partition("=")[0]
            i += 2 if name in _PY_LONG_VALUED and "=" not in word else 1
            continue
        if not word.startswith("-") or word == "-":
            return None if word == "-" else ("script", word, list(argv[i + 1:]))
        done, target, i = _short_options(argv, i)
        if done:
            return target
    return None


def _short_options(argv: Sequence[str], i: int) -> tuple[bool, tuple[str, str, list[str]] | None, int]:
    """A word of short options at ``argv[i]`` (``-u``, ``-Wd``, ``-m name``): (whether the target is known, the
    target, the index of the next word to read)."""
    word = argv[i]
    for k, letter in enumerate(word[1:], start=1):
        if letter in _PY_FLAGS:
            continue
        attached = word[k + 1:]
        if letter in ("m", "c"):
            kind = "module" if letter == "m" else "command"
            if attached:
                return True, (kind, attached, list(argv[i + 1:])), i
            return True, (kind, argv[i + 1], list(argv[i + 2:])) if i + 1 < len(argv) else None, i
        if letter in _PY_VALUED:
            return False, None, i + (1 if attached else 2)  # the value is the rest of this word, or the next word
        return True, None, i  # an option this reader does not know: it cannot tell what follows
    return False, None, i + 1


def identify(argv: Sequence[str], cwd: str = "") -> tuple[str, list[str]] | None:
    """``(launcher, its arguments)`` when ``argv`` starts torchrun (``"torch.distributed.run"``), the old
    ``torch.distributed.launch`` or ``accelerate launch`` (``"accelerate"``), directly or through ``python``, ``env``
    or ``uv run``; None otherwise. ``cwd`` is the process's working directory, against which a console script's
    relative path is read."""
    # Shape: peel wrappers (python, env, uv run, console scripts) one per turn until a launcher or nothing is left
    for _ in range(8):  # wrappers inside wrappers, a few deep
        if not argv:
            return None
        program = os.path.basename(argv[0])
        if _PYTHON.match(program):
            found, script = _through_python(argv)
            if script is None:
                return found
            argv = script  # a script: read on as if it ran by itself
            continue
        if program in _LAUNCHER_PROGRAMS:
            return _launcher(program, _LAUNCHER_PROGRAMS, list(argv[1:]))
        if program == "env":
            argv = _after_env(argv)
            continue
        if _RUNNERS.get(program) is not None and len(argv) > 1 and argv[1] == _RUNNERS[program]:
            return _after_runner(argv, cwd)
        # A bare name is no script: /proc shows a script by the path the interpreter opened.
        module = _console_script_module(os.path.join(cwd, argv[0])) if "/" in argv[0] else None
        if module is None:
            return None
        return _launcher(module, _LAUNCHER_MODULES, list(argv[1:]))
    return None


def _through_python(argv: Sequence[str]) -> tuple[tuple[str, list[str]] | None, list[str] | None]:
    """What ``python ...`` runs: (the launcher it runs as a module, or None; None) when that settles it, or (None, the
    script's command line) to read on."""
    target = python_target(argv)
    if target is None or target[0] == "command":
        return None, None
    kind, name, rest = target
    if kind == "module":
        return _launcher(name, _LAUNCHER_MODULES, rest), None
    return None, [name, *rest]


def _launcher(name: str, table: dict[str, str | None], rest: list[str]) -> tuple[str, list[str]] | None:
    if name not in table:
        return None
    sub = table[name]
    if sub is not None:  # `accelerate launch ...`; `accelerate config` is no launcher
        if not rest or rest[0] != sub:
            return None
        rest = rest[1:]
    family = "accelerate" if name.startswith("accelerate") else name
    return ("torch.distributed.run" if family == "torchrun" else family), rest


def _after_env(argv: Sequence[str]) -> list[str]:
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return list(argv[i + 1:])
        if word.startswith("-"):
            i += 2 if word in _ENV_VALUED else 1
        elif "=" in word:
            i += 1
        else:
            break
    return list(argv[i:])


def _after_runner(argv: Sequence[str], cwd: str) -> tuple[str, list[str]] | None:
    # The runner's own options are many and change between versions: the command is the first word from which a
    # launcher reads, or the word after `--`.
    for i in range(2, len(argv)):
        if argv[i] == "--":
            return identify(argv[i + 1:], cwd)
        if not argv[i].startswith("-"):
            found = identify(argv[i:], cwd)
            if found is not None:
                return found
    return None


def _console_script_module(path: str) -> str | None:
    """The module a console script runs (``from torch.distributed.run import main``), read off its first lines."""
    try:
        # A regular file only, opened without blocking: an ancestor's "script" may be a FIFO (`python /dev/stdin`),
        # whose open would wait for a writer forever.
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            head = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    match = _CONSOLE_SCRIPT.search(head)
    return match.group(1).decode() if match else None


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


def find_launcher(pid: int | None = None, *, depth: int = 8) -> tuple[str, list[str], list[str]] | None:
    """The nearest ancestor of ``pid`` (default: this process) that is torchrun or ``accelerate launch`` (see
    :func:`identify`), read from /proc: ``(launcher, its arguments, its whole command line)``; None when there is
    none or /proc cannot tell."""
    current = os.getpid() if pid is None else pid
    for _ in range(depth):
        parent = parent_pid(current)
        if parent is None or parent <= 1:
            return None
        current = parent
        try:
            with open(f"/proc/{current}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except (OSError, ValueError, IndexError):
            return None
        try:
            cwd = os.readlink(f"/proc/{current}/cwd")
        except OSError:
            cwd = ""
        found = identify(argv, cwd)
        if found is not None:
            return found[0], found[1], argv
    return None


def launcher_argv(pid: int | None = None, *, depth: int = 8) -> list[str] | None:
    """The whole command line of the launcher that started ``pid`` (see :func:`find_launcher`), or None."""
    found = find_launcher(pid, depth=depth)
    return None if found is None else found[2]
