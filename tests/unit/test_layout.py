"""The package's shape, checked on every run of the suite (and so by CI): floors of folders that import only
downwards, no import cycle, no module past 400 lines, a thin facade, and no function more complex than 12 (radon's
measure, which counts boolean operators; ruff's C901 does not)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"  # read, not imported: a cycle would fail the import

#: Bottom first: each floor's folders (and top-level modules) import only from their own floor or below; the
#: coordinators (runtime/) stand above the parts they coordinate. A new folder or top-level module must say where
#: it belongs. docs/architecture.md draws the same floors.
FLOORS = [
    ["_errors", "_figures", "_clock", "_env", "_slurm", "_safefs", "_tree", "_comm", "log"],  # no slurmrt folder below
    ["record", "launch"],  # the event log; the launch as Slurm describes it
    ["stop"],  # the parts of an agreed stop: signals, the deadline, the kill switch, the agreement, stragglers
    ["options", "checkpoint", "trackers"],  # every option validated; the checkpoint store, its tiers and files
    ["recovery"],  # the one plan and its executor: requeue, in-job restart, exclusion, `slurmrt run`
    ["hang"],  # detection and naming (watchdog, census) and the response, which asks recovery
    ["runtime"],  # init(), the Runtime and the coordinators it builds
    ["__init__", "__main__", "cli", "sim", "integrations"],  # what users call
]

MAX_LINES = 400
#: The facade that init() returns: it forwards, the parts work.
FACADE = ("runtime/facade.py", 260)
MAX_COMPLEXITY = 12


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    module = _module(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if module == "__init__":
        package = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join([*base, node.module]) if node.module else ".".join(base)
            for alias in node.names:  # `from . import cuda` imports a module; `from .x import name` module x
                candidate = f"{target}.{alias.name}" if target else alias.name
                is_module = (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                    (ROOT / candidate.replace(".", "/")).is_dir()
                found.add(candidate if is_module else target)
    return {m for m in found if m}


def _unit(module: str) -> str:
    """The folder a module lives in, or the top-level module itself."""
    return module.split(".")[0]


def _floor(unit: str) -> int:
    for level, names in enumerate(FLOORS):
        if unit in names:
            return level
    raise AssertionError(f"slurmrt.{unit} has no floor in tests/unit/test_layout.py")


def _cycle(graph: dict[str, set[str]]) -> str | None:
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> str | None:
        if node in path:
            return " -> ".join((*path[path.index(node):], node))
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            found = visit(target, (*path, node))
            if found:
                return found
        done.add(node)
        return None

    return next((c for c in (visit(n, ()) for n in sorted(graph)) if c), None)


GRAPH = {_module(p): _imports(p) for p in ROOT.rglob("*.py")}
FOLDERS = {u: {_unit(i) for m, imports in GRAPH.items() if _unit(m) == u for i in imports} - {u}
           for u in {_unit(m) for m in GRAPH}}


def test_every_folder_imports_only_from_its_own_floor_or_below() -> None:
    upward = sorted(f"{m} -> {i}" for m, imports in GRAPH.items() for i in imports
                    if _floor(_unit(i)) > _floor(_unit(m)))
    assert upward == []


def test_no_two_folders_import_each_other_even_through_others() -> None:
    assert _cycle(FOLDERS) is None


def test_the_import_graph_of_modules_has_no_cycle() -> None:
    assert _cycle(GRAPH) is None


def test_the_guards_catch_what_they_guard() -> None:
    """The checks above, on made-up graphs: a cycle across folders and an import running up a floor are found."""
    assert _cycle({"stop": {"hang"}, "hang": {"recovery"}, "recovery": {"stop"}}) == "hang -> recovery -> stop -> hang"
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _floor("record") < _floor("recovery") < _floor("hang") < _floor("runtime")


def test_no_module_passes_400_lines_and_the_facade_stays_thin() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
    name, most = FACADE
    assert sizes[name] <= most, f"{name} has {sizes[name]} lines: build new parts elsewhere, forward to them"


def _complexity(source: str) -> dict[str, int]:
    """Each function's and method's cyclomatic complexity, as radon counts it (boolean operators included)."""
    from radon.complexity import cc_visit

    found: dict[str, int] = {}
    for block in cc_visit(source):
        name = f"{block.classname}.{block.name}" if getattr(block, "classname", None) else block.name
        found[name] = block.complexity
        for method in getattr(block, "methods", []):  # a class's methods, each on its own
            found[f"{block.name}.{method.name}"] = method.complexity
    return found


def test_no_function_passes_complexity_12_counting_boolean_operators() -> None:
    pytest.importorskip("radon.complexity", reason="radon measures complexity (pip install radon)")
    over = {f"{path.relative_to(ROOT)}:{name}": c for path in sorted(ROOT.rglob("*.py"))
            for name, c in _complexity(path.read_text()).items() if c > MAX_COMPLEXITY}
    assert over == {}, "split these functions (a test names what each part does)"


def test_the_complexity_guard_counts_what_ruff_does_not() -> None:
    """Five ifs and eight boolean operators: ruff's C901 says 6, radon 14, and the guard fails it."""
    pytest.importorskip("radon.complexity", reason="radon measures complexity (pip install radon)")
    body = "\n".join(f"    if a and b and c{i}: return {i}" for i in range(4))
    assert _complexity(f"def f(a, b, c0, c1, c2, c3):\n{body}\n    return a or b\n")["f"] > MAX_COMPLEXITY
