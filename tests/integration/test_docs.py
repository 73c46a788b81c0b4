"""Every code block the docs mark as runnable, run as a reader would: page by page in the order of the site's
navigation, each page's blocks in the order the page gives them, all in one directory outside the clone, with the
examples copied next to the reader (as the quickstart says), the built wheel installed (never the source tree), and
its `slurmrt` and the project's environment's `python` first on PATH, outside any Slurm job.

The mark is an HTML comment on the line before the block, invisible on the site: `<!-- run -->` (the block exits 0),
or `<!-- run: exit=1 expect="NodeCountError: NNODES=2" -->` for a block that shows an error: its exit code, and text
its output must hold."""

from __future__ import annotations

import os
import re
import shutil
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


def reading_order() -> list[str]:
    """The pages as a reader meets them: the README, then the site's navigation in order, then any page it leaves
    out."""
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    order = ["README.md", *(f"docs/{page}" for page in nav)]
    pages = sorted({b.page.split(":")[0] for b in BLOCKS})
    return [p for p in order if p in pages] + [p for p in pages if p not in order]


PAGES = reading_order()


def test_the_docs_mark_blocks_to_run() -> None:
    assert len(BLOCKS) >= 5, [b.page for b in BLOCKS]
    assert PAGES.index("docs/quickstart.md") < PAGES.index("docs/guides/simulator.md") < \
        PAGES.index("docs/reference/cli.md"), PAGES


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A reader's directory outside the clone, with the examples copied in (and the quickstart as `train.py`, which
    the simulator's page uses), and the environment of someone who installed the built wheel."""
    build = tmp_path_factory.mktemp("wheel")
    tree = build / "tree"  # built from a copy: the clone stays as it is
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(build / "dist"), str(tree)],
                   check=True, capture_output=True)
    (wheel,) = (build / "dist").glob("slurmrt-*.whl")
    site = build / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    home = tmp_path_factory.mktemp("reader")
    shutil.copytree(ROOT / "examples", home / "examples")
    shutil.copy(ROOT / "examples" / "quickstart" / "train.py", home / "train.py")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC", "PYTHON"))}
    env.update({"PATH": f"{site / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
                "PYTHONPATH": str(site), "TMPDIR": str(tmp_path_factory.mktemp("tmp"))})
    where = subprocess.run(["slurmrt", "--version"], env=env, cwd=home, capture_output=True, text=True, check=True)
    found = subprocess.run([sys.executable, "-c", "import slurmrt; print(slurmrt.__file__)"], env=env, cwd=home,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found.startswith(str(site)) and where.stdout.strip(), (found, where.stdout)
    return home, env


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", PAGES)
def test_a_page_s_runnable_blocks_run_in_order_from_outside_the_clone(page: str,
                                                                     reader: tuple[Path, dict[str, str]]) -> None:
    home, env = reader
    for block in (b for b in BLOCKS if b.page.split(":")[0] == page):
        script = home / ("block.sh" if block.language == "bash" else "block.py")
        script.write_text(("set -euo pipefail\n" if block.language == "bash" else "") + block.code)
        command = ["bash", str(script)] if block.language == "bash" else [sys.executable, str(script)]
        out = subprocess.run(command, cwd=home, env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == block.exit, (f"{block.page}: exit {out.returncode}, expected {block.exit}\n"
                                              f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        if block.expect is not None:
            assert block.expect in out.stdout + out.stderr, \
                f"{block.page}: no {block.expect!r} in\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
