"""Every code block the docs mark as runnable, run as a reader would: from the repository's root, with the project's
environment's `python` and `slurmrt` first on PATH, outside any Slurm job.

The mark is an HTML comment on the line before the block, invisible on the site: `<!-- run -->` (the block exits 0),
or `<!-- run: exit=1 expect="NodeCountError: NNODES=2" -->` for a block that shows an error: its exit code, and text
its output must hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .launch import ROOT

pytestmark = pytest.mark.timeout(600)

MARK = re.compile(r"^<!-- run(?::(?P<attrs>.*?))?\s*-->\s*$")
ATTR = re.compile(r'(\w+)=(?:"([^"]*)"|(\S+))')
FENCE = re.compile(r"^```(\w+)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    exit: int
    expect: str | None


def runnable_blocks() -> list[Block]:
    blocks = []
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        lines = page.read_text().splitlines()
        for i, text in enumerate(lines):
            mark = MARK.match(text)
            if not mark:
                continue
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if fence is None or fence.group(1) not in ("bash", "python"):
                raise AssertionError(f"{where}: a run mark must be followed by a ```bash or ```python block")
            end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise AssertionError(f"{where}: the block is never closed")
            attrs = {m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
                     for m in ATTR.finditer(mark.group("attrs") or "")}
            if set(attrs) - {"exit", "expect"}:
                raise AssertionError(f"{where}: unknown run attributes {sorted(set(attrs) - {'exit', 'expect'})}")
            blocks.append(Block(where, i + 1, fence.group(1), "\n".join(lines[i + 2:end]) + "\n",
                                int(attrs.get("exit", 0)), attrs.get("expect")))
    return blocks


BLOCKS = runnable_blocks()


def test_the_docs_mark_blocks_to_run() -> None:
    assert len(BLOCKS) >= 5, [b.page for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.page for b in BLOCKS])
def test_a_runnable_block_of_the_docs_runs(block: Block, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))}
    env.update({"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
                "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path)})
    script = tmp_path / ("block.sh" if block.language == "bash" else "block.py")
    script.write_text(("set -euo pipefail\n" if block.language == "bash" else "") + block.code)
    command = ["bash", str(script)] if block.language == "bash" else [sys.executable, str(script)]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert out.returncode == block.exit, (f"{block.page}: exit {out.returncode}, expected {block.exit}\n"
                                          f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    if block.expect is not None:
        assert block.expect in out.stdout + out.stderr, f"{block.page}: no {block.expect!r} in\n{out.stderr[-3000:]}"
