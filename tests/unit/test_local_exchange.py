"""The local tier's exchange with a partner that is lost in the middle of it: the loss is what the rank raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurmrt.checkpoint import local
from slurmrt.checkpoint._files import HASH
from slurmrt.checkpoint.local import LocalTier


class _Comm:
    rank, world_size, group = 0, 2, None


def test_a_partner_lost_during_the_send_is_raised_not_the_mapped_files_close(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    part = tmp_path / "rank_00000.pt"
    part.write_bytes(b"x" * 4096)
    calls: list[Any] = []

    def pairwise(ops: list[tuple[Any, int, bool]], group: Any) -> None:
        calls.append(ops)  # held, as gloo's pending work and the traceback's frames hold the tensors
        if len(calls) == 2:  # the parts, after the headers
            raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3461")

    monkeypatch.setattr(local, "pairwise", pairwise)
    tier = LocalTier(tmp_path, tmp_path / "ckpt", node="n1", comm=_Comm(), per_node=1)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        tier._exchange(part, {"size": 4096, HASH: "0" * 16}, 1, 1)
