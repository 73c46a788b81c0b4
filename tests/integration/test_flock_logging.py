"""Eight processes write long lines to one file at once: through the flock handler every line arrives whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
import logging, os, sys, time
import slurmrt.log
rank = int(sys.argv[1]); mode = sys.argv[2]; path = sys.argv[3]; lines = int(sys.argv[4])
time.sleep(max(0.0, float(sys.argv[5]) - time.time()))  # every writer starts at the same instant
os.environ["RANK"] = str(rank)
payload = chr(ord("a") + rank) * 6000  # longer than a pipe buffer's atomic write (PIPE_BUF = 4096)
if mode == "handler":
    log = logging.getLogger("writer")
    slurmrt.log.install(logging.INFO, path=path, logger=log)
    for i in range(lines):
        log.info("%d %s", i, payload)
elif mode == "print":
    with open(path, "a") as f:
        for i in range(lines):
            slurmrt.printflock(f"{i} {payload}", file=f, lock_path=path + ".lock")
else:  # unsynchronised, in small pieces the way a buffered stream flushes: the control
    with open(path, "a", buffering=1) as f:
        for i in range(lines):
            for k in range(0, len(payload), 1000):
                f.write(payload[k:k + 1000]); f.flush()
            f.write("\\n")
"""

GOOD = re.compile(r"^\[[^\]]+:(\d)\] (?:\S+ \S+ INFO writer: )?(\d+) (.)\3{5999}$")
RAW = re.compile(r"^(.)\1{5999}$")


def _run(tmp: Path, mode: str, lines: int = 200) -> list[str]:
    path = tmp / f"{mode}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start_at = str(time.time() + 3.0)  # after every interpreter has started, even on a loaded machine
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(r), mode, str(path), str(lines), start_at], env=env)
             for r in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    return path.read_text().splitlines()


@pytest.mark.parametrize("mode", ["handler", "print"])
def test_eight_processes_never_interleave_through_flock(tmp_path: Path, mode: str) -> None:
    lines = _run(tmp_path, mode)
    assert len(lines) == 8 * 200
    damaged = [line[:80] for line in lines if not GOOD.match(line)]
    assert damaged == []
    order: dict[int, list[int]] = {}
    for line in lines:
        m = GOOD.match(line)
        assert m is not None and chr(ord("a") + int(m.group(1))) == m.group(3)  # the prefix names the writer
        order.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    assert order == {r: list(range(200)) for r in range(8)}  # each writer's lines whole, once, in its order


def test_the_same_load_without_the_lock_does_interleave(tmp_path: Path) -> None:
    """The control: proves the check above can fail on this machine."""
    lines = _run(tmp_path, "raw", lines=1000)
    assert sum(1 for line in lines if not RAW.match(line)) > 0
