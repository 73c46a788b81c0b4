"""The "Convert your script" page shows the real difference between each before/after pair of examples/convert."""

from __future__ import annotations

import difflib

import pytest

from tests.integration.launch import ROOT

PAIRS = ["ddp", "trainer", "lightning", "accelerate"]


@pytest.mark.parametrize("name", PAIRS)
def test_the_page_shows_the_diff_of_the_files(name: str) -> None:
    before = (ROOT / "examples" / "convert" / f"{name}_before.py").read_text().splitlines(keepends=True)
    after = (ROOT / "examples" / "convert" / f"{name}_after.py").read_text().splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(before, after, f"{name}_before.py", f"{name}_after.py"))
    page = (ROOT / "docs" / "guides" / "convert.md").read_text()
    assert f"```diff\n{diff}```" in page, f"docs/guides/convert.md: regenerate the {name} diff"
    assert f"examples/convert/{name}_after.py" in page  # and the block that runs it under slurmrt sim
