"""A checkpoint directory that one node does not share, as real processes: two "nodes" of two ranks each, the
second node's ranks in a mount namespace of their own with a tmpfs over the checkpoint path (what a node-local
``/tmp`` or scratch is). Before this check the job saved and said "committed" while the second node's parts existed
only in its own tmpfs; now every rank stops before the first save, with one line naming the node and the fix, and
nothing is committed.

The commit's own check, for a directory that stops being shared after the survey (a mount that appears mid-run), is
tested at the store: rank 0 never writes a manifest naming a file it does not see.

Needs root (``unshare -m`` and ``mount``), as CI has; skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import WORKER, free_port, two_node_env

NODES = ("localhost", "nodeb")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a mount namespace")


def _start(tmp: Path, ckpt: Path, *, apart: bool, local: Path | None = None) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for rank in range(4):
        node = rank // 2
        env = two_node_env(rank, tmp, NODES, port=port, extra={
            "SLURMRT_CHECKPOINT_DIR": str(ckpt), "SLURMRT_REQUEUE": "0",
            **({"SLURMRT_LOCAL_CHECKPOINT_DIR": str(local)} if local is not None else {})})
        argv = [sys.executable, str(WORKER), "--out", str(tmp / "out"), "--steps", "12", "--step-time", "0",
                "--save-every", "4", *(["--local-every", "2"] if local is not None else [])]
        if apart and node == 1:  # this node's own directory at the same path: a tmpfs in a namespace of its own
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs slurmrt-test "$0" && exec "$@"', str(ckpt), *argv]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def test_a_checkpoint_directory_one_node_does_not_share_stops_every_rank_before_anything_is_committed(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    procs = _start(tmp_path, ckpt, apart=True)
    results = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    err = "".join(e for _, e in results)
    assert codes == [78] * 4, (codes, err[-3000:])
    said = [line for line in err.splitlines() if "is not one directory for every node" in line]
    assert said and all("nodeb" in line and "Fix:" in line and str(ckpt) in line for line in said), err[-3000:]
    assert len(said) == 2, said  # one line per node, not one per rank
    assert "Traceback" not in err, err[-3000:]
    assert not list(ckpt.glob("step_*")), sorted(p.name for p in ckpt.iterdir())


def test_a_shared_checkpoint_directory_passes_the_survey_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """The same job with one directory for both nodes trains, commits and leaves no survey directory."""
    ckpt = tmp_path / "ckpt"
    local = tmp_path / "local"  # both "nodes" on one disk: the local tier's partners protect nothing, said once
    local.mkdir()
    procs = _start(tmp_path, ckpt, apart=False, local=local)
    results = [p.communicate(timeout=300) for p in procs]
    err = "".join(e for _, e in results)
    assert [p.returncode for p in procs] == [0] * 4, err[-3000:]
    assert (ckpt / "step_000000011").is_dir() or list(ckpt.glob("step_*")), sorted(p.name for p in ckpt.iterdir())
    assert not list(ckpt.glob(".slurmrt-nodes-*"))
    shared = [line for line in err.splitlines() if "is shared by nodes" in line]
    assert len(shared) == 1 and "localhost, nodeb" in shared[0], err[-3000:]
