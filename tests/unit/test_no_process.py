"""The unit suite's guard (tests/unit/conftest.py) refuses every way to start a process, multiprocessing's
included: a unit test that starts one fails, and says where it belongs."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest


def _nothing() -> None:
    pass


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    lambda: multiprocessing.get_context("spawn").Process(target=_nothing).start(),
    lambda: multiprocessing.get_context("forkserver").Process(target=_nothing).start(),
    lambda: multiprocessing.get_context("fork").Process(target=_nothing).start(),
], ids=["subprocess", "spawn", "forkserver", "fork"])
def test_a_unit_test_that_starts_a_process_fails(start: object) -> None:
    with pytest.raises(AssertionError, match="belongs in tests/integration"):
        start()  # type: ignore[operator]
