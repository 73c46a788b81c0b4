"""Fixtures every suite may use."""

from __future__ import annotations

import os
import shutil
import subprocess
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
