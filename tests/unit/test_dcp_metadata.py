"""Rank 0's merge of every rank's own DCP metadata into the checkpoint's one ``.metadata``
(slurmrt.checkpoint.sharded.merge_metadata), on DCP's real metadata classes; and which holder of a replica writes
it (``holder``)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from slurmrt._errors import CheckpointError
from slurmrt.checkpoint.sharded import merge_metadata

SIZE = torch.Size([4, 3])


def part(rank: int, rows: list[int], *, size: torch.Size = SIZE, step: bool = False) -> Metadata:
    """What one rank planned alone: rows ``rows`` of tensor "w" (one row each), and the object "step" if asked."""
    chunks = [ChunkStorageMetadata(offsets=torch.Size([r, 0]), sizes=torch.Size([1, size[1]])) for r in rows]
    items: dict[str, object] = {"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), size, chunks)}
    storage = {MetadataIndex("w", torch.Size([r, 0])): _StorageInfo(f"__{rank}_0.distcp", 100 * i, 100)
               for i, r in enumerate(rows)}
    if step:
        items["step"] = BytesStorageMetadata()
        storage[MetadataIndex("step")] = _StorageInfo(f"__{rank}_0.distcp", 900, 7)
    return Metadata(state_dict_metadata=items, storage_data=storage, planner_data={"w": ("w",)})  # type: ignore[arg-type]


def test_the_ranks_chunks_and_places_become_one_metadata_that_finds_each_in_its_ranks_file() -> None:
    merged = merge_metadata([part(0, [0, 1], step=True), part(1, [2]), part(2, [3])])
    w = merged.state_dict_metadata["w"]
    assert sorted(tuple(c.offsets) for c in w.chunks) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert merged.storage_data[MetadataIndex("w", torch.Size([2, 0]))].relative_path == "__1_0.distcp"
    assert merged.storage_data[MetadataIndex("w", torch.Size([3, 0]))].relative_path == "__2_0.distcp"
    assert merged.storage_data[MetadataIndex("step")].relative_path == "__0_0.distcp"
    assert isinstance(merged.state_dict_metadata["step"], BytesStorageMetadata)
    assert merged.planner_data == {"w": ("w",)}


def test_a_chunk_two_ranks_wrote_is_read_from_the_lower_rank_and_listed_once() -> None:
    merged = merge_metadata([part(0, [0, 1]), part(1, [1, 2, 3])])
    assert len(merged.state_dict_metadata["w"].chunks) == 4
    assert merged.storage_data[MetadataIndex("w", torch.Size([1, 0]))].relative_path == "__0_0.distcp"


def test_a_tensor_whose_chunks_do_not_fill_it_is_refused_with_its_name_and_counts() -> None:
    with pytest.raises(CheckpointError, match=r"w: the ranks' chunks hold 9 of its 12 elements"):
        merge_metadata([part(0, [0, 1]), part(1, [3])])


def test_ranks_that_saved_one_tensor_with_two_shapes_are_refused() -> None:
    with pytest.raises(CheckpointError, match=r"w: the ranks saved it with different shapes \(\[4, 3\] and \[5, 3\]\)"):
        merge_metadata([part(0, [0, 1]), part(1, [2, 3], size=torch.Size([5, 3]))])


def test_the_merge_leaves_the_ranks_own_metadata_as_it_was() -> None:
    first = part(0, [0, 1])
    merge_metadata([first, part(1, [2, 3])])
    assert len(first.state_dict_metadata["w"].chunks) == 2  # type: ignore[union-attr]


NAMES = [f"model.layers.{i}.{part}" for i in range(16) for part in ("weight", "bias", "norm.weight")]


def test_replicas_spread_over_their_holders_and_an_offset_is_part_of_the_pick() -> None:
    from slurmrt.checkpoint.sharded import holder

    picks = [holder(MetadataIndex(n), 4) for n in NAMES]
    assert set(picks) == {0, 1, 2, 3}
    assert max(picks.count(h) for h in range(4)) <= len(NAMES) // 2
    by_offset = {holder(MetadataIndex("w", torch.Size([r, 0])), 4) for r in range(0, 64, 4)}
    assert len(by_offset) > 1, "the chunks of one tensor replicated elsewhere are spread too"
