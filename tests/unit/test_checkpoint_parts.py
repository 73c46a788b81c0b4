"""A large per-rank state written in parts (one file per writer thread): what loads back, what is checked."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from slurmrt._comm import SoloComm
from slurmrt.checkpoint import parts
from slurmrt.checkpoint.store import CheckpointStore


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


class Holder:
    """An object slurmrt does not look into: its tensor stays in the main file."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


@pytest.fixture(autouse=True)
def _small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "SPLIT_MIN_BYTES", 1024)  # the tests' states are split from 1 KiB


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(64, 32)
    sd = model.state_dict()  # an OrderedDict with _metadata
    tied = torch.randn(100, generator=g)
    return {"model": sd, "tied_a": tied, "tied_b": tied, "view": tied[10:20],
            "optim": {"state": {0: {"exp_avg": torch.randn(500, generator=g), "step": torch.tensor(3.0)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "pair": Pair(torch.arange(300.0), 7), "list": [torch.ones(200, dtype=torch.int64), "x"],
            "holder": Holder(torch.full((50,), 2.0)), "sparse": torch.eye(4).to_sparse(), "step": 9}


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.layout == b.layout
        assert torch.equal(a.to_dense(), b.to_dense()) if a.is_sparse else torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, Holder):
        assert torch.equal(a.t, b.t)
    else:
        assert a == b


def test_a_large_state_is_written_in_parts_and_loads_back_equal_with_its_structure(tmp_path: Path) -> None:
    state = _state()
    files = parts.write_parts(tmp_path, "rank_00000.pt", state, threads=3)
    assert sorted(files) == ["rank_00000.part1.pt", "rank_00000.part2.pt", "rank_00000.part3.pt", "rank_00000.pt"]
    assert all(files[n]["size"] == (tmp_path / n).stat().st_size for n in files)
    back = parts.read_state(tmp_path / "rank_00000.pt")
    _same(state, back)
    assert back["model"]._metadata == state["model"]._metadata  # load_state_dict reads the version from it
    # Tensors that shared a storage still do: tied weights stay tied, a view stays a view.
    assert back["tied_a"].untyped_storage().data_ptr() == back["tied_b"].untyped_storage().data_ptr()
    assert back["view"].untyped_storage().data_ptr() == back["tied_a"].untyped_storage().data_ptr()
    back["tied_a"][10] = 123.0
    assert back["view"][0] == 123.0 and back["tied_b"][10] == 123.0


def test_a_small_state_is_one_file_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "SPLIT_MIN_BYTES", 1 << 30)
    state = _state()
    assert list(parts.write_parts(tmp_path, "rank_00000.pt", state, threads=4)) == ["rank_00000.pt"]
    loaded = torch.load(tmp_path / "rank_00000.pt", weights_only=False)  # an ordinary torch.save file
    assert isinstance(loaded, dict) and loaded["step"] == 9
    _same(state, parts.read_state(tmp_path / "rank_00000.pt"))


def test_one_writer_thread_writes_one_file(tmp_path: Path) -> None:
    assert list(parts.write_parts(tmp_path, "rank_00000.pt", _state(), threads=1)) == ["rank_00000.pt"]


def test_the_store_lists_every_part_in_the_manifest_and_a_damaged_part_falls_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path, SoloComm(), keep_last=3)
    first, second = _state(), _state()
    second["model"]["weight"] = second["model"]["weight"] + 1
    store.save(first, 1)
    store.save(second, 2)
    manifest = json.loads((tmp_path / "step_000000002" / "manifest.json").read_text())
    names = sorted(manifest["files"])
    assert [n for n in names if ".part" in n] and "rank_00000.pt" in names
    got = store.load_latest()
    assert got is not None and got.step == 2
    _same(second, got.state)
    damaged = tmp_path / "step_000000002" / "rank_00000.part1.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    got = store.load_latest()
    assert got is not None and got.step == 1
    _same(first, got.state)
    assert "rank_00000.part1.pt: checksum" in caplog.text


def test_a_missing_part_is_a_missing_file_of_the_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, SoloComm(), keep_last=3)
    store.save(_state(), 1)
    store.save(_state(), 2)
    (tmp_path / "step_000000002" / "rank_00000.part2.pt").unlink()
    got = store.load_latest()
    assert got is not None and got.step == 1


def test_an_ordered_dict_subclass_keeps_its_type(tmp_path: Path) -> None:
    state = {"od": collections.OrderedDict(a=torch.zeros(400), b=torch.ones(400))}
    parts.write_parts(tmp_path, "rank_00000.pt", state, threads=2)
    back = parts.read_state(tmp_path / "rank_00000.pt")
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["a", "b"]
    _same(state, back)


def test_a_main_file_that_names_parts_elsewhere_is_refused(tmp_path: Path) -> None:
    from slurmrt import CheckpointError

    outside = tmp_path / "outside.pt"
    torch.save({"k": torch.zeros(2)}, outside)
    (tmp_path / "step").mkdir()
    torch.save(parts.Parts({"w": parts.Ref(0, "k")}, ["../outside.pt"]), tmp_path / "step" / "rank_00000.pt")
    with pytest.raises(CheckpointError, match="not a file slurmrt wrote"):
        parts.read_state(tmp_path / "step" / "rank_00000.pt")


def test_a_main_file_whose_entry_is_missing_from_its_part_is_refused(tmp_path: Path) -> None:
    from slurmrt import CheckpointError

    torch.save({"0": torch.zeros(2)}, tmp_path / "rank_00000.part1.pt")
    torch.save(parts.Parts({"w": parts.Ref(0, "7")}, ["rank_00000.part1.pt"]), tmp_path / "rank_00000.pt")
    with pytest.raises(CheckpointError, match="not in its part file"):
        parts.read_state(tmp_path / "rank_00000.pt")


def test_a_defaultdict_keeps_its_factory(tmp_path: Path) -> None:
    state = {"d": collections.defaultdict(list, a=torch.zeros(400))}
    parts.write_parts(tmp_path, "rank_00000.pt", state, threads=2)
    back = parts.read_state(tmp_path / "rank_00000.pt")
    assert type(back["d"]) is collections.defaultdict and back["d"].default_factory is list
    assert torch.equal(back["d"]["a"], torch.zeros(400))
