"""The node-local checkpoint tier with real processes and real gloo: 4 ranks on 2 "nodes" (each its own local
directory, as /dev/shm is per node), saving to the local tier every 5 steps and to the shared one every 10. Every rank
dies at step 27 (the allocation lost), and the next run resumes:

- from the local tier when both nodes come back (nothing read from the shared tier, nothing from a peer);
- from the local tier when one node is replaced by a fresh one: its ranks' parts come from the partner node;
- from the shared tier when a local part is damaged, or both copies of a part are gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmrt.checkpoint.local import tier_directory

from .conftest import expected_weights
from .launch import WORKER, free_port, two_node_env

NODES = ("localhost", "nodeb")
STEPS = 40


def run(tmp: Path, out: str, *, nodes: tuple[str, str] = NODES, extra_args: tuple[str, ...] = (),
        restart: int = 0) -> list[int]:
    port = free_port()
    (tmp / "local").mkdir(exist_ok=True)  # the node's own directory (/dev/shm): slurmrt never creates it
    procs = []
    for rank in range(4):
        env = two_node_env(rank, tmp, nodes, port=port, extra={
            "SLURM_RESTART_COUNT": str(restart), "SLURMRT_CHECKPOINT_DIR": str(tmp / "shared"),
            "SLURMRT_LOCAL_CHECKPOINT_DIR": str(tmp / "local"), "SLURMRT_REQUEUE": "0"})
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "--out", str(tmp / out), "--steps", str(STEPS),
                                       "--step-time", "0", "--save-every", "10", "--local-every", "5",
                                       *extra_args], env=env))
    return [p.wait(timeout=300) for p in procs]


def node_dir(tmp: Path, node: str) -> Path:
    return tier_directory(tmp / "local", tmp / "shared", node)


def resume_event(tmp: Path) -> dict[str, Any]:
    events = [json.loads(line) for line in (tmp / "shared" / "events-4242.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "resume"][-1]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A first run that saved locally at steps 4, 14, 24, shared at 9 and 19, then lost every rank at step 27."""
    tmp = tmp_path_factory.mktemp("died")
    assert run(tmp, "run0", extra_args=("--die-at", "27")) == [9, 9, 9, 9]
    for node in NODES:
        steps = sorted(p.name for p in node_dir(tmp, node).iterdir())
        assert steps == ["step_000000014", "step_000000024"], steps  # keep 2 (9 and 19 went to the shared tier)
        assert len(list((node_dir(tmp, node) / "step_000000024").glob("rank_*.pt"))) == 4  # own 2 + 2 replicas
    return tmp


@pytest.fixture
def died(first_run: Path, tmp_path: Path) -> Path:
    """A copy of the first run's directories (the paths inside them are relative to it: the tier's key is the
    checkpoint directory's path, so the copy is keyed anew)."""
    shutil.copytree(first_run / "shared", tmp_path / "shared", symlinks=True)
    shutil.copytree(first_run / "local", tmp_path / "local", symlinks=True)
    for node in NODES:
        old = tier_directory(tmp_path / "local", first_run / "shared", node)
        new = tier_directory(tmp_path / "local", tmp_path / "shared", node)
        new.parent.mkdir(mode=0o700, exist_ok=True)
        old.rename(new)
    return tmp_path


def finished(tmp: Path, out: str, first: int) -> None:
    ranks = [json.loads((tmp / out / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["start"] == first and r["exit_code"] == 0 for r in ranks)
    assert ranks[0]["w"] == pytest.approx(expected_weights(STEPS, 4), abs=1e-5)


def test_the_next_run_resumes_from_the_local_tier_without_reading_the_shared_one(died: Path) -> None:
    assert run(died, "run1", restart=1) == [0, 0, 0, 0]
    event = resume_event(died)
    assert event["step"] == 24 and event["tier"] == "local" and event["from_peers"] == 0
    assert event["local_held"] == 24  # the newest step the local tier held whole: the one read
    finished(died, "run1", 25)
    assert not list((died / "local").glob("slurmrt-*/*/*")), "a finished run leaves no local tier behind"


def test_a_replaced_node_gets_its_ranks_parts_from_the_partner_node(died: Path) -> None:
    assert run(died, "run1", nodes=("localhost", "nodec"), restart=1) == [0, 0, 0, 0]  # nodeb is gone
    event = resume_event(died)
    assert event["step"] == 24 and event["tier"] == "local"
    part = (node_dir(died, "nodeb") / "step_000000024" / "rank_00002.pt").stat().st_size
    assert event["from_peers"] == 2 * part  # ranks 2 and 3, from their replicas on localhost
    finished(died, "run1", 25)


def test_a_damaged_part_sends_the_run_to_the_shared_tier(died: Path) -> None:
    part = node_dir(died, "localhost") / "step_000000024" / "rank_00000.pt"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    part.write_bytes(bytes(data))
    assert run(died, "run1", restart=1) == [0, 0, 0, 0]
    event = resume_event(died)
    assert event["step"] == 19 and event["tier"] == "shared"
    finished(died, "run1", 20)


def test_a_part_lost_on_both_nodes_sends_the_run_to_the_shared_tier(died: Path) -> None:
    for node in NODES:  # rank 1's part on its node, and its replica on the partner
        (node_dir(died, node) / "step_000000024" / "rank_00001.json").unlink()
    assert run(died, "run1", restart=1) == [0, 0, 0, 0]
    event = resume_event(died)
    assert event["step"] == 19 and event["tier"] == "shared"
    # step 14 is still whole on the nodes: the local tier could serve a failure, though the shared tier's was newer
    assert event["local_held"] == 14
    finished(died, "run1", 20)


def test_a_local_directory_open_to_others_is_refused_and_training_goes_on(tmp_path: Path) -> None:
    (tmp_path / "local" / f"slurmrt-{os.getuid()}").mkdir(parents=True)
    os.chmod(tmp_path / "local" / f"slurmrt-{os.getuid()}", 0o777)  # planted, or made by mistake
    assert run(tmp_path, "run0") == [0, 0, 0, 0]
    assert not list((tmp_path / "local" / f"slurmrt-{os.getuid()}").iterdir())
    finished(tmp_path, "run0", 0)
    shutil.rmtree(tmp_path / "local")
