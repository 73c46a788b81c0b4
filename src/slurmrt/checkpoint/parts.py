"""A rank's state written as several files at once: one ``torch.save`` is one writer, and a disk (a parallel
filesystem above all) takes bytes faster from several.

A state with at least :data:`SPLIT_MIN_BYTES` of tensors is written as ``threads`` part files plus the main file:

- ``rank_00000.pt``, the main file: a :class:`Parts` holding the state with each tensor it reaches through dicts,
  lists and tuples replaced by a :class:`Ref`, and the part files' names;
- ``rank_00000.part1.pt`` ... : each a ``torch.save`` of ``{key: tensor}``, written by its own thread.

Tensors that share a storage (tied weights, views) go to the same part, so ``torch.save`` keeps them shared, as it
does in one file. Each file is an ordinary file of the checkpoint: its own checksum, hashed as it is written, in the
manifest, and the same commit, verification and refusal rules. A smaller state (and one with ``threads`` 1) is one
``torch.save`` file, as before, and so are checkpoints written by earlier versions: :func:`read_state` reads both.

Not split: a tensor inside another object (a dataclass, a custom class) stays in the main file. If it shares a
storage with a tensor that went to a part, the two are no longer shared after the load (their values are).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from ._files import FileInfo, write_state
from .helper import HelperLost

__all__ = ["SPLIT_MIN_BYTES", "Parts", "Ref", "read_state", "write_parts"]

#: The least bytes of tensors for which a state is written in parts.
SPLIT_MIN_BYTES = 64 << 20


class Ref:
    """Where a tensor of a state written in parts went: part ``part`` (0-based), entry ``key``."""

    __slots__ = ("key", "part")

    def __init__(self, part: int, key: str) -> None:
        self.part, self.key = part, key

    def __reduce__(self) -> tuple[type[Ref], tuple[int, str]]:
        return Ref, (self.part, self.key)


class Parts:
    """The main file of a state written in parts."""

    __slots__ = ("files", "state")

    def __init__(self, state: Any, files: list[str]) -> None:
        self.state, self.files = state, files

    def __reduce__(self) -> tuple[type[Parts], tuple[Any, list[str]]]:
        return Parts, (self.state, self.files)


def _map(obj: Any, leaf: Callable[[Any], Any | None]) -> Any:
    """``obj`` with every leaf that ``leaf`` replaces (a non-None answer) replaced, through dicts, lists and tuples
    (named tuples keep their type); other objects are kept as they are."""
    # Shape: one case per container kind (dict, list, tuple, named tuple), as a structural map reads
    got = leaf(obj)
    if got is not None:
        return got
    if isinstance(obj, dict):
        out = {k: _map(v, leaf) for k, v in obj.items()}
        return out if type(obj) is dict else _rebuilt(obj, out)
    if isinstance(obj, list) and type(obj) is list:
        return [_map(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        items = [_map(v, leaf) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def _rebuilt(original: dict[Any, Any], items: dict[Any, Any]) -> Any:
    """A dict subclass with new values: a shallow copy keeps its type and attributes (an OrderedDict's order, a
    ``state_dict()``'s ``_metadata``, a defaultdict's factory)."""
    try:
        out = copy.copy(original)
        out.update(items)
    except Exception:  # noqa: BLE001 - a subclass that cannot be copied: a plain dict of the same items
        return items
    return out


def _storage(obj: Any) -> tuple[tuple[str, int], int] | None:
    """(which storage, its bytes) of a plain dense tensor; None for anything else (sparse and quantized tensors,
    subclasses such as DTensor, non-tensors), which stays in the main file."""
    import torch

    if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.layout != torch.strided or obj.is_quantized:
        return None
    s = obj.untyped_storage()
    return (str(obj.device), s.data_ptr()), s.nbytes()


def write_parts(directory: Path, name: str, state: dict[str, Any], *, threads: int,
                helper: Any = None) -> dict[str, FileInfo]:
    """Write ``state`` as ``directory/name`` (in parts when it is large, see the module); each file written with
    its checksum, by name. With a :class:`~.helper.Helper`, the save helper process writes the part files (tensors
    only) and this thread the main file (the objects around them, whose classes only this process may know)."""
    # Shape: place the tensors, then one writer (small state, the helper, or threads) and the main file last
    storages: dict[tuple[str, int], int] = {}  # storage -> part
    loads = [0] * max(threads, 1)
    groups: list[dict[str, Any]] = [{} for _ in loads]
    keys = itertools.count()

    def place(obj: Any) -> Ref | None:
        found = _storage(obj)
        if found is None:
            return None
        where, size = found
        part = storages.get(where)
        if part is None:  # the part with the fewest bytes so far takes a new storage
            part = storages[where] = loads.index(min(loads))
            loads[part] += size
        key = str(next(keys))
        groups[part][key] = obj
        return Ref(part, key)

    skeleton = _map(state, place)  # references only: no tensor's bytes are copied
    if threads <= 1 or sum(loads) < SPLIT_MIN_BYTES:
        return {name: write_state(directory / name, state)}
    stem = name.removesuffix(".pt")
    names = [f"{stem}.part{i + 1}.pt" for i in range(threads) if groups[i]]
    used = [g for g in groups if g]
    files: dict[str, FileInfo] | None = None
    if helper is not None and helper.ready():  # started by the first state that needs it; till ready, threads
        with contextlib.suppress(HelperLost):  # lost mid-write: threads write the same files over again
            files = helper.write_states(directory, dict(zip(names, used, strict=True)))
    if files is None:
        with ThreadPoolExecutor(len(used), thread_name_prefix="slurmrt-save") as pool:
            infos = list(pool.map(lambda job: write_state(directory / job[0], job[1]), zip(names, used, strict=True)))
        files = dict(zip(names, infos, strict=True))
    files[name] = write_state(directory / name, Parts(skeleton, names))  # type: ignore[arg-type]
    return files


def read_state(file: Path) -> Any:
    """A state :func:`write_parts` wrote (one file or in parts), loaded to the CPU."""
    main = _load(file)
    if not isinstance(main, Parts):
        return main
    stem = file.name.removesuffix(".pt")
    expected = [f"{stem}.part{i + 1}.pt" for i in range(len(main.files))]
    if main.files != expected:  # only files beside it, named as write_parts names them: never a path elsewhere
        raise CheckpointError(f"{file}: names part files {main.files!r}, not {expected!r}: not a file slurmrt wrote")
    with ThreadPoolExecutor(len(main.files) or 1, thread_name_prefix="slurmrt-load") as pool:
        parts = list(pool.map(lambda n: _load(file.with_name(n)), main.files))
    try:
        return _map(main.state, lambda obj: parts[obj.part][obj.key] if isinstance(obj, Ref) else None)
    except (IndexError, KeyError, TypeError) as err:
        raise CheckpointError(f"{file}: a tensor's entry is not in its part file ({err!r}): not a file slurmrt "
                              "wrote") from err


def _load(file: Path) -> Any:
    import torch

    with open(file, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=False)
