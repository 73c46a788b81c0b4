"""The agreement's all-reduce: recursive doubling over pairs, checked as a schedule (with real gloo pairs in
tests/integration/test_tree.py)."""

from __future__ import annotations

import pytest

from slurmrt._tree import gather_schedule, partners


def _run_schedule(size: int, values: list[int]) -> list[int]:
    """Every rank follows its schedule; a hop happens when two ranks are both next in line for each other (as a
    2-rank gloo group pairs its operations in order). Fails on a deadlock."""
    held = list(values)
    todo = {r: partners(r, size) for r in range(size)}
    while any(todo.values()):
        ready = [(r, todo[r][0]) for r in range(size) if todo[r] and todo[todo[r][0]] and todo[todo[r][0]][0] == r]
        assert ready, f"size {size}: no pair can proceed: {todo}"
        r, p = ready[0]
        held[r] = held[p] = max(held[r], held[p])
        todo[r].pop(0)
        todo[p].pop(0)
    return held


@pytest.mark.parametrize("size", [*range(1, 34), 100, 257])
def test_every_rank_ends_with_the_max_without_a_deadlock(size: int) -> None:
    for top in range(size):  # the max on each rank in turn
        values = [0] * size
        values[top] = 7
        assert _run_schedule(size, values) == [7] * size


@pytest.mark.parametrize("size", [2, 3, 8, 12, 1024, 1000, 16384])
def test_hops_and_peers_grow_as_log2(size: int) -> None:
    p = 1 << (size.bit_length() - 1)
    levels = p.bit_length() - 1
    for rank in {0, 1, size // 2, size - 1}:
        hops = partners(rank, size)
        assert len(hops) <= levels + 2
        assert len(set(hops)) <= levels + 1
        assert rank not in hops and all(0 <= h < size for h in hops)


def test_a_rank_outside_the_group_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 4 is not in a group of 4"):
        partners(4, 4)
    with pytest.raises(ValueError, match="rank 4 is not in a group of 4"):
        gather_schedule(4, 4)


def _run_gather(size: int) -> list[set[int]]:
    """Every rank follows its gather schedule; a hand-over happens when the sender and its receiver are both next
    in line for each other. Fails on a deadlock, or on a rank acting after it handed its bytes over."""
    held = [{r} for r in range(size)]
    todo = {r: gather_schedule(r, size) for r in range(size)}
    done: set[int] = set()
    while any(todo.values()):
        ready = [r for r in range(size) if todo[r] and todo[r][0][1] and todo[todo[r][0][0]]
                 and todo[todo[r][0][0]][0] == (r, False)]
        assert ready, f"size {size}: no hand-over can proceed: {todo}"
        sender = ready[0]
        receiver = todo[sender][0][0]
        assert sender not in done and receiver not in done
        held[receiver] |= held[sender]
        held[sender] = set()
        done.add(sender)
        todo[sender].pop(0)
        todo[receiver].pop(0)
        assert not todo[sender], f"rank {sender} has hops after handing its bytes over"
    return held


@pytest.mark.parametrize("size", [*range(1, 34), 100, 257, 1000])
def test_the_gather_brings_every_ranks_bytes_to_rank_0_once_over_the_trees_pairs(size: int) -> None:
    held = _run_gather(size)
    assert held[0] == set(range(size))
    assert all(not h for h in held[1:])
    for rank in range(size):
        hops = gather_schedule(rank, size)
        assert {peer for peer, _ in hops} <= set(partners(rank, size))  # no connection beyond the tree's
        assert len(hops) <= (size.bit_length() - 1) + 1  # log2 P hops, and the fold
