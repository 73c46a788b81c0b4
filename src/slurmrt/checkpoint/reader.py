"""What a run reads from a sound checkpoint: its own state, its rank-local state, or why it cannot load it (another
world size, sharded state without a state dict to load it into)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from . import sharded
from .parts import read_state

__all__ = ["Incompatible", "read_local", "read_rank_state", "refuse_incompatible"]


class Incompatible(CheckpointError):
    """The checkpoint is sound but cannot be loaded by this run (another world size)."""


def refuse_incompatible(path: Path, manifest: dict[str, Any], *, world_size: int, into: dict[str, Any] | None) -> None:
    if manifest["kind"] == "dcp" and into is None:
        raise Incompatible(
            f"{path} holds sharded state (DCP): load it into this run's state dict, sharded as this run shards "
            "it: load_latest(into={'model': ..., 'optim': ...}) with the same keys as the save")
    if manifest["kind"] == "state" and manifest["world_size"] != world_size:
        raise Incompatible(
            f"{path} was written by {manifest['world_size']} ranks and this run has {world_size}; "
            "per-rank state cannot be resharded. Run with the same world size, or save sharded state (DTensor, "
            "through DCP), which reshards",
        )


def read_local(path: Path, manifest: dict[str, Any], *, rank: int, world_size: int) -> tuple[Any, str | None]:
    """This rank's local state (RNG, data position), or why it is not restored."""
    name = f"{sharded.LOCAL_DIR}/rank_{rank:05d}.pt"
    if not any(n.startswith(f"{sharded.LOCAL_DIR}/") for n in manifest["files"]):
        return None, None
    if manifest["world_size"] != world_size:
        return None, (f"the rank-local state was saved by {manifest['world_size']} ranks and this run has "
                      f"{world_size}: it is not restored (each rank starts its RNG and data position afresh)")
    return _torch_load(path / name)["local"], None


def read_rank_state(path: Path, manifest: dict[str, Any], *, rank: int, into: dict[str, Any] | None) -> Any:
    """This rank's state: ``into`` loaded in place ("dcp", collective), the directory ("dir"), or this rank's dict
    ("state")."""
    if manifest["kind"] == "dcp":
        assert into is not None  # refuse_incompatible refused it on every rank
        sharded.load_dcp(into, path)
        return into
    if manifest["kind"] == "dir":
        return path
    return read_state(path / f"rank_{rank:05d}.pt")


def _torch_load(file: Path) -> Any:
    import torch

    with open(file, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=False)
