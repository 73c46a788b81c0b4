"""Letting go of an aborted default group, so that its connections close (the in-process restart's abort).

gloo closes a group's sockets only when the group is destroyed: ``_abort_process_group`` and the backend's ``abort``
leave them open while anything still holds the group (measured with torch 2.13: a peer in an all-reduce with the
aborting rank waited until that process exited). A peer in a collective with a rank that raised then waits for the
group's timeout instead of failing at once. Two holders that a training meets without knowing:

- the frames of the exception that ended the generation: their locals (a ``DistributedDataParallel`` model holds its
  group; so does a ``ShardedGradScaler``);
- functions whose default argument is the default group of the time they were made: ``torch.distributed.nn.functional``
  takes ``group=group.WORLD`` when it is imported (its ten collectives), as do ``ZeroRedundancyOptimizer``'s helper and
  ``ShardedGradScaler.__init__``. Imported after the group exists (a checkpoint library imports it), they hold the
  first generation's group for good.

:func:`release` drops both: it clears the finished frames' locals, and gives every function default that is the
group ``None`` instead (which torch reads as the default group of the time, as the default meant). Scanning the
functions of every module takes about 40 ms with torch loaded; a full garbage collection (about 130 ms) runs only
when something still holds the group after that.

Under NCCL too: ``ncclCommAbort`` ends the communicator whoever holds it, so the sockets are not the reason there,
but a function default that is the aborted group would send the next generation's collectives to a dead group; the
``None`` it gets is what the default meant (the default group of the time). Only a default that *is* the aborted
group object changes; nothing else in any module is touched. Why not a group slurmrt owns and hands to the training
(torchft's way): the defaults above are bound by libraries at import, not by the training, and no handle the
training passes reaches them; the default group is what they use, so the default group is what is replaced.
"""

from __future__ import annotations

import gc
import sys
import traceback
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["release"]

#: The references to the group that :func:`release` holds itself while it runs: its argument and
#: ``sys.getrefcount``'s.
_OWN = 2


def release(group: Any, err: BaseException | None, abort: Callable[[], None]) -> int:
    """Drop the references to ``group`` that the failed generation left (``err``'s frames' locals, and function
    defaults: see the module's docstring), then ``abort()`` it (torch lets go of its own). Returns how many references
    are left besides the call's own: 0 when the group is destroyed as the call returns (the caller should keep
    none: pass ``dist.group.WORLD`` itself)."""
    if err is not None:
        traceback.clear_frames(err.__traceback__)  # frames still running (the caller's) are left as they are
    with warnings.catch_warnings():  # a module's deprecated names warn when looked at
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            for fn in _functions(module):
                _scrub(fn, group)
    abort()
    if sys.getrefcount(group) > _OWN:
        gc.collect()  # a model's cycles (hooks that refer back to it): a full collection, only when one is needed
    return sys.getrefcount(group) - _OWN


def _functions(module: Any) -> list[types.FunctionType]:
    """The module's functions, and those of the classes it defines."""
    try:
        values = list(vars(module).values())  # a copy: another thread may import or define as this runs
        name = getattr(module, "__name__", None)
        found = [v for v in values if isinstance(v, types.FunctionType)]
        for cls in (v for v in values if isinstance(v, type) and getattr(v, "__module__", None) == name):
            found += [m for m in list(vars(cls).values()) if isinstance(m, types.FunctionType)]
    except (TypeError, RuntimeError):  # a stand-in without a __dict__; a class changed as it was read
        return []
    return found


def _scrub(fn: types.FunctionType, group: Any) -> None:
    if fn.__defaults__ and any(d is group for d in fn.__defaults__):
        fn.__defaults__ = tuple(_other(d, group) for d in fn.__defaults__)
    if fn.__kwdefaults__ and any(d is group for d in fn.__kwdefaults__.values()):
        fn.__kwdefaults__ = {k: _other(d, group) for k, d in fn.__kwdefaults__.items()}


def _other(value: Any, group: Any) -> Any:
    """``value``, or None where it is ``group``."""
    return None if value is group else value
