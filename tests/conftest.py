"""Fixtures every suite may use."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parent / "slurm" / "cluster.sh"


@pytest.fixture(scope="session")
def scontrol() -> str:
    """Path of a real ``scontrol``, the oracle for hostlist tests. Installed (Debian's slurm-wlm) when missing and
    running as root; otherwise the test is skipped, and under CI=true that is a failure: CI must run the oracle."""
    found = shutil.which("scontrol")
    if found is None and os.geteuid() == 0:
        out = subprocess.run(["bash", str(CLUSTER), "install"], capture_output=True, text=True, timeout=900)
        found = shutil.which("scontrol")
        if found is None:
            pytest.fail(f"tests/slurm/cluster.sh install did not give scontrol: {out.stderr.strip()[-2000:]}")
    if found is None:
        reason = "scontrol is not installed (apt-get install slurm-client, or run the tests as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the scontrol oracle tests: {reason}")
        pytest.skip(reason)
    return found


@pytest.fixture(autouse=True)
def _no_false_stragglers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every run of a test that times its steps (tests/integration/worker.py does) looks for stragglers; a test
    not marked ``stragglers`` that finds one in its event logs has a false positive (issue 23: none in the suite)."""
    # Asked for before the test runs, so that it is torn down after this fixture looks at it.
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is None or request.node.get_closest_marker("stragglers"):
        return
    named = []
    for root, _, files in os.walk(tmp):  # errors ignored: a background prune may still remove a directory
        for name in files:
            entry = Path(root, name)
            if name.endswith(".jsonl") and entry.is_file() and not entry.is_symlink():  # not a planted FIFO or link
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    text = entry.read_text()
                    named += [line for line in text.splitlines() if '"event": "straggler"' in line]
    assert not named, f"a straggler named in a test that slows no rank (a false positive): {named[:3]}"


@pytest.fixture(autouse=True, scope="module")
def _module_node_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A module's own fixtures (the cluster scenarios' jobs submitted together) run before any test's own ledger is
    set: they get one of the module's, never the user's in the home directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURMRT_NODE_LEDGER", str(tmp_path_factory.mktemp("module-ledger") / "bad-nodes.json"))
        yield


@pytest.fixture(autouse=True)
def _own_node_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test has a bad-node ledger of its own (slurmrt.record.ledger): none writes into the user's, in the home
    directory, and none inherits what an earlier test wrote down."""
    monkeypatch.setenv("SLURMRT_NODE_LEDGER", str(tmp_path_factory.mktemp("ledger") / "bad-nodes.json"))
