"""The node count a launcher per node is given, checked against the nodes it will run on before it starts.

``torchrun --nnodes 3`` (or ``accelerate launch --num_machines 3``) in a 2-node job never starts its workers: it
waits in its rendezvous for a third node until its timeout, and ``init()``'s own check never runs. So ``slurmrt run``
(and ``slurmrt doctor --launch`` in a batch script) reads the launcher's node count from the command it is about to
start: the launcher found the way :func:`~slurmrt.launch.launcher.identify` finds it, also inside ``bash -c '...'``
and behind a container's own command (``apptainer exec ...``), with ``$NNODES``-style variables expanded from the
environment that will run it. A value that cannot be read there (a command substitution) is not guessed at.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence

from .._errors import NodeCountError
from .launcher import identify

__all__ = ["check", "launcher_nodes"]

_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})
#: The launchers' options for the node count: torchrun's, accelerate's (both spellings).
_NODE_OPTIONS = ("--nnodes", "--num_machines", "--num-machines")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_COUNT = re.compile(r"([0-9]+)(?::([0-9]+))?")


def _words(command: Sequence[str]) -> list[str]:
    """The command's words, with a shell's ``-c`` script split into words of its own (shell syntax: a ``;`` or
    ``&&`` stays a word, which no launcher takes)."""
    words: list[str] = []
    for i, word in enumerate(command):
        if i >= 2 and command[i - 1] == "-c" and os.path.basename(command[i - 2]) in _SHELLS:
            try:
                script = shlex.split(word, comments=True)
            except ValueError:  # unbalanced quotes: the shell would refuse it too
                words.append(word)
                continue
            words += _words(script)
        else:
            words.append(word)
    return words


def _expand(word: str, env: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` in ``word`` from ``env``; a variable it does not hold stays as written."""
    return _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), word)


def launcher_nodes(command: Sequence[str], env: Mapping[str, str]) -> tuple[str, str, int, int] | None:
    """(the launcher, its option as written with its value, the fewest and the most nodes its rendezvous takes:
    torchrun's elastic ``MIN:MAX``, else the count twice) when ``command`` starts torchrun or ``accelerate launch``
    with a node count that ``env`` resolves; None otherwise."""
    words = _words(command)
    expanded = [_expand(w, env) for w in words]  # `$PY -m torch.distributed.run`: the launcher, as the shell runs it
    for start in range(len(words)):
        found = identify(expanded[start:])
        if found is not None:  # its options as written (one word for one word), for the message
            return _node_option(found[0], words[len(words) - len(found[1]):], env)
    return None


def _node_option(launcher: str, args: list[str], env: Mapping[str, str]) -> tuple[str, str, int, int] | None:
    """The node count among the launcher's options (up to the training script, whose own options are its own)."""
    for i, word in enumerate(args):
        if word.endswith(".py"):
            return None
        name, eq, value = word.partition("=")
        if name not in _NODE_OPTIONS:
            continue
        raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        expanded = _expand(raw, env)
        count = _COUNT.fullmatch(expanded)
        if count is None:
            return None
        shown = f"{name} {raw}" + (f" (= {expanded})" if expanded != raw else "")
        return launcher, shown, int(count.group(1)), int(count.group(2) or count.group(1))
    return None


def check(command: Sequence[str], env: Mapping[str, str], *, nodes: int, where: str, fix: str) -> None:
    """:class:`~slurmrt.NodeCountError` when ``NNODES`` in ``env``, or the node count of the launcher ``command``
    starts, differs from ``nodes``, the nodes the command will run on (``where`` says which); ``fix`` says how to
    get them to agree."""
    nnodes = env.get("NNODES", "").strip()
    if nnodes.isdigit() and int(nnodes) != nodes:
        raise NodeCountError(f"NNODES={nnodes} but {where} {nodes} node(s): the rendezvous would wait for "
                             f"{nnodes} and hang until its timeout. Fix: {fix}", declared=int(nnodes), actual=nodes)
    found = launcher_nodes(command, env)
    if found is not None and not found[2] <= nodes <= found[3]:
        launcher, shown, low, high = found
        name = "torchrun" if launcher == "torch.distributed.run" else f"{launcher} launch"
        wants = f"{low}" if low == high else f"{low} to {high}"
        raise NodeCountError(f"{name} {shown} but {where} {nodes} node(s): its rendezvous would wait for {wants} "
                             f"node(s) and hang until its timeout, before any training process starts. Fix: {fix}",
                             declared=low if low > nodes else high, actual=nodes)
