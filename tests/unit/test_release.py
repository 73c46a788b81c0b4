"""Letting go of an aborted default group (``slurmrt.runtime.release``): what holds it after a failed generation is
dropped, so that gloo destroys it and its connections close. A plain object stands in for the group."""

from __future__ import annotations

import sys
import types

import pytest

from slurmrt.runtime.release import release


class Group:
    pass


def holders(group: Group) -> int:
    """The references to ``group`` besides the caller's."""
    return sys.getrefcount(group) - 3


def aborted() -> None:
    """torch's abort, which lets go of its own references (here, none)."""


def test_function_defaults_made_while_the_group_existed_let_it_go(monkeypatch: pytest.MonkeyPatch) -> None:
    group, other = Group(), Group()
    module = types.ModuleType("made_with_a_group")
    module.__dict__.update(G=group, O=other)
    exec("def all_reduce(t, op=0, group=G): return group\n"  # as torch.distributed.nn.functional's
         "def kw(t, *, group=G, keep=O): return group, keep\n"
         "class Scaler:\n    def __init__(self, process_group=G): self.pg = process_group\n", module.__dict__)
    del module.G
    monkeypatch.setitem(sys.modules, "made_with_a_group", module)
    assert holders(group) == 3
    assert release(group, None, aborted) == 1 and holders(group) == 0  # 1: this test's own
    # None: torch reads it as the default group of the time, as the default meant
    assert module.all_reduce(1) is None and module.kw(1) == (None, other) and module.Scaler().pg is None


def test_the_failed_frames_locals_let_it_go() -> None:
    group = Group()

    def train(g: Group) -> None:
        model = {"process_group": g}  # a DistributedDataParallel model holds its group
        raise RuntimeError(f"fault with {len(model)} model")

    try:
        train(group)
    except RuntimeError as err:
        assert holders(group) == 2  # train's argument and its model
        assert release(group, err, aborted) == 1 and holders(group) == 0
        assert "fault with 1 model" in str(err) and err.__traceback__ is not None  # the error itself is kept


def test_a_group_held_in_a_cycle_is_collected_and_one_still_held_is_counted() -> None:
    group = Group()
    model: dict[str, object] = {"process_group": group}
    model["self"] = model  # a model's hooks refer back to it
    del model
    assert holders(group) == 1
    assert release(group, None, aborted) == 1
    kept = [group]  # the user keeps it: said, not hidden
    assert release(group, None, aborted) == 2 and kept
