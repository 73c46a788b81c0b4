"""Where each rank's part of a local-tier checkpoint lives, and which step the ranks can load from what the nodes
hold: pure functions of ranks and holdings, used by :mod:`.local` (its saves send each part to :func:`partner_of`;
its load asks :func:`choose`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["choose", "holder_of", "partner_of"]


def partner_of(rank: int, world: int, per_node: int) -> int | None:
    """The rank that keeps ``rank``'s replica: the same local rank on the next node; None on one node."""
    if world <= per_node:
        return None
    return (rank + per_node) % world


def choose(everyone: list[dict[int, dict[int, dict[str, Any]]]], world: int, floor: int | None
            ) -> tuple[int, list[int], list[dict[str, Any]]] | None:
    """The newest step whose every part is held, with each part's holder (the rank itself when its node has it,
    else the lowest rank that holds it) and meta; None when no step qualifies."""
    # Shape: newest step first, the first whose every part has a holder; a floor ends the search
    steps = sorted({s for held in everyone for s in held}, reverse=True)
    for step in steps:
        if floor is not None and step < floor:
            return None
        holders = [holder_of(everyone, step, r, world) for r in range(world)]
        if all(h is not None for h in holders):
            chosen = [h for h in holders if h is not None]
            return step, chosen, [everyone[h][step][r] for r, h in enumerate(chosen)]
    return None


def holder_of(everyone: list[dict[int, dict[int, dict[str, Any]]]], step: int, rank: int, world: int) -> int | None:
    """Who reads ``rank``'s part of ``step``: the rank itself when its node holds it, else the lowest rank that
    holds it; None when nobody does (for this world size)."""
    owners = [i for i, held in enumerate(everyone) if held.get(step, {}).get(rank, {}).get("world_size") == world]
    if not owners:
        return None
    return rank if rank in owners else owners[0]
