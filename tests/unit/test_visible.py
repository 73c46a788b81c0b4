"""What rank 0 sees before it commits, and the node survey's verdicts (slurmrt.checkpoint.visible), with one process:
the other ranks' reports come from a comm that answers for them, as a node that writes elsewhere would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from slurmrt import CheckpointError
from slurmrt._comm import SoloComm
from slurmrt.checkpoint._files import HASH
from slurmrt.checkpoint.store import CheckpointStore
from slurmrt.checkpoint.visible import Survey, check_parts


class _TwoRanks(SoloComm):
    """Rank 0 of two: rank 1's part of every gather is ``other`` (its files written where rank 0 cannot see)."""

    world_size = 2

    def __init__(self, other: Any) -> None:
        self.other = other

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj, self.other]


def test_check_parts_names_each_file_missing_or_of_another_size(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"12")
    parts = [{"a": {"size": 5}}, {"b": {"size": 3}, "c": {"size": 1}}]
    assert check_parts(tmp_path, parts, threads=1) == check_parts(tmp_path, parts, threads=4) == [
        "rank 1: b has 2 bytes, not 3", "rank 1: c missing"]
    assert check_parts(tmp_path, [{"a": {"size": 5}}]) == []


def test_a_commit_never_names_a_part_rank_0_cannot_see(tmp_path: Path) -> None:
    """Rank 1 reports a part that does not exist in rank 0's view: nothing is committed, the previous checkpoint
    stays the newest, and the error says why."""
    good = CheckpointStore(tmp_path, SoloComm())
    good.save({"w": torch.ones(2)}, 3)
    elsewhere = ("state", {"rank_00001.pt": {"size": 1234, HASH: "0" * 16}}, None)
    store = CheckpointStore(tmp_path, _TwoRanks(elsewhere))
    with pytest.raises(CheckpointError, match="rank 0 does not see 1 file.*rank 1: rank_00001.pt missing.*not one "
                                              "directory for every node"):
        store.save({"w": torch.zeros(2)}, 4)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000003"]
    assert not list(tmp_path.glob(".tmp-*"))


def test_the_survey_names_the_nodes_apart_from_the_first_and_those_that_share() -> None:
    apart = Survey(("n1", "n2", "n3"), {"n1": ("n2",), "n3": ("n2",), "n2": ("n1", "n3")}, {})
    assert not apart.one_directory and apart.apart() == ("n2",) and apart.shared_by == ("n1", "n3")
    alone = Survey(("n1", "n2"), {"n1": ("n2",), "n2": ("n1",)}, {})
    assert alone.shared_by == () and alone.apart() == ("n2",)
    one = Survey(("n1", "n2"), {}, {})
    assert one.one_directory and one.apart() == () and one.shared_by == ("n1", "n2")
    broken = Survey(("n1", "n2"), {}, {"n2": "n2: cannot write in /x: Permission denied"})
    assert not broken.one_directory and broken.apart() == ("n2",) and broken.shared_by == ("n1",)


def test_a_node_name_that_cannot_name_a_file_is_a_finding_not_a_path(tmp_path: Path) -> None:
    from slurmrt.checkpoint.visible import survey

    got = survey(tmp_path, SoloComm(), node="../etc", lead=True, token="t")
    assert not got.one_directory and "cannot name a file" in got.errors["'../etc'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing written outside its own directory, or left"
