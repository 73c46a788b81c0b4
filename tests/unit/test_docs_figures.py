"""The figures the pages quote have one source, benchmarks/RESULTS.md. A page marks what it quotes:

    <!-- figures: Recovery: in the job against a requeue; Stragglers | not from RESULTS.md: 180 s -->
    ... text or a table quoting the figures ...
    <!-- /figures -->

and every figure with a unit between the marks (``3.1 s``, ``0.26 s``, ``4.2-4.3 s``, ``1.85x``, ``65.8 %``) must be
a figure of one of the named sections, as written or rounded to the digits the page gives. ``not from RESULTS.md``:
the block's settings, defaults and the observations it explains itself, which no benchmark measures. Every paragraph
that cites RESULTS.md is inside such a block, so a page cannot quote a figure that no test compares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

BLOCK = re.compile(r"<!-- figures: (?P<sections>[^|>]+?)(?: \| not from RESULTS.md: (?P<exempt>[^>]+?))? -->"
                   r"(?P<body>.*?)<!-- /figures -->", re.S)
#: A figure and its unit; a range (4.2-4.3 s, 3-4 s) is two figures.
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))? ?(?:s|ms|µs|%|x)(?![\w-])")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def sections(text: str) -> dict[str, str]:
    """RESULTS.md's ``## `` sections by title."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def figures(text: str) -> list[str]:
    return [n for m in FIGURE.finditer(text) for n in m.groups() if n is not None]


def quoted(figure: str, numbers: set[str]) -> bool:
    """``figure`` is one of ``numbers``, or one of them rounded to as many decimals as ``figure`` has."""
    places = len(figure.partition(".")[2])
    return figure in numbers or any(f"{float(n):.{places}f}" == figure for n in numbers)


def unquoted(page: str, results: dict[str, str]) -> list[str]:
    """Each figure of ``page``'s marked blocks that no named section has, and each section that RESULTS.md lacks."""
    wrong = []
    for block in BLOCK.finditer(page):
        names = [n.strip() for n in block["sections"].split(";")]
        wrong += [f"no section {n!r} in RESULTS.md" for n in names if n not in results]
        numbers = {n for name in names for n in NUMBER.findall(results.get(name, ""))}
        exempt = set(figures(block["exempt"] or ""))
        wrong += [f"{f} (in {block['body'].strip()[:80]!r}...)" for f in figures(block["body"])
                  if f not in exempt and not quoted(f, numbers)]
    return wrong


def uncovered(page: str) -> list[str]:
    """Paragraphs that cite RESULTS.md outside a marked block."""
    outside = BLOCK.sub("", page)
    return [p.strip()[:100] for p in re.split(r"\n\s*\n", outside) if "RESULTS.md" in p]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_a_page_quotes_is_one_of_results_md(path: Path) -> None:
    page = path.read_text()
    assert unquoted(page, sections(RESULTS.read_text())) == []
    assert uncovered(page) == [], "a paragraph cites RESULTS.md without <!-- figures: ... --> around it"


def test_a_figure_that_differs_from_results_md_is_found() -> None:
    results = {"Recovery": "| kill rank 1 | 3.13, 3.97 | 0.26 |\nthe credential expiry, 10 s", "Other": "4.16"}
    page = ("<!-- figures: Recovery | not from RESULTS.md: 180 s -->\n3.1 s in all (at most 4.0 s), 0.26 s, 3-4 s, "
            "180 s by default\n<!-- /figures -->")
    assert unquoted(page, results) == []
    assert [w.split()[0] for w in unquoted(page.replace("3.1 s", "3.2 s"), results)] == ["3.2"]
    assert [w.split()[0] for w in unquoted(page.replace("0.26 s", "the expiry, 11 s"), results)] == ["11"]
    assert [w.split()[0] for w in unquoted(page.replace("3-4 s", "4.2-4.3 s"), results)] == ["4.2", "4.3"]
    assert [w.split()[0] for w in unquoted(page.replace(" | not from RESULTS.md: 180 s", ""), results)] == ["180"]
    assert unquoted(page.replace("Recovery", "Lost"), results)[0] == "no section 'Lost' in RESULTS.md"
    assert uncovered("text\n\nfigures in `benchmarks/RESULTS.md`: 5.5 s\n\nmore") == \
        ["figures in `benchmarks/RESULTS.md`: 5.5 s"]
    assert uncovered(page.replace("180 s by default", "180 s (RESULTS.md)")) == []
