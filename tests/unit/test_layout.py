"""The package's shape, checked on every run of the suite (and so by CI): floors of folders that import only
downwards, no import cycle, no module past 400 lines, a thin facade, and no function more complex than 12."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"  # read, not imported: a cycle would fail the import

#: Bottom first: each floor's folders (and top-level modules) import only from their own floor or below; the
#: coordinators (runtime/) stand above the parts they coordinate. A new folder or top-level module must say where
#: it belongs. docs/architecture.md draws the same floors.
FLOORS = [
    ["_errors", "_clock", "_env", "_slurm", "_safefs", "_tree", "_comm", "log"],  # no slurmrt folder below
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
#: Functions above MAX_COMPLEXITY (radon's measure, which counts boolean operators), and the complexity each had when
#: this guard came in. The list only shrinks: none of them may grow, a function that drops to MAX_COMPLEXITY must
#: leave it, and no other function may pass MAX_COMPLEXITY.
TOO_COMPLEX = {
    "checkpoint/local.py:_choose": 13, "checkpoint/manifest.py:_entry_problem": 14,
    "checkpoint/manifest.py:check_files": 22, "checkpoint/manifest.py:manifest_problems": 19,
    "checkpoint/sharded.py:merge_metadata": 19, "checkpoint/store.py:CheckpointStore._save": 15,
    "cli/sim.py:run": 17, "cli/status.py:_describe": 19, "cli/status.py:status": 16,
    "hang/census.py:Census.collect": 13, "hang/census.py:name_suspects": 19,
    "launch/launcher.py:identify": 14,
    "launch/launcher.py:python_target": 18, "launch/topology.py:from_environ": 18,
    "record/timeline.py:_Canvas.run": 16, "record/timeline.py:_account_lost": 17, "record/timeline.py:_run_life": 21,
    "record/timeline.py:draw": 23, "runtime/session.py:CheckpointSession.load_latest": 18,
    "sim/runner.py:_Run.act": 20, "sim/runner.py:_simulate": 21, "sim/shims.py:scontrol": 20,
    "sim/srun.py:_wait": 13, "sim/srun.py:layout": 21, "sim/srun.py:parse": 17, "sim/summary.py:summary": 19,
    "stop/pidfiles.py:registered": 13,
}


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


def test_no_function_passes_complexity_12_and_the_known_ones_only_shrink() -> None:
    radon = pytest.importorskip("radon.complexity", reason="radon measures complexity (pip install radon)")
    found: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for block in radon.cc_visit(path.read_text()):
            name = f"{block.classname}.{block.name}" if getattr(block, "classname", None) else block.name
            found[f"{path.relative_to(ROOT)}:{name}"] = block.complexity
            for method in getattr(block, "methods", []):  # a class's methods, each on its own
                found[f"{path.relative_to(ROOT)}:{block.name}.{method.name}"] = method.complexity
    over = {name: c for name, c in found.items() if c > MAX_COMPLEXITY and c > TOO_COMPLEX.get(name, 0)}
    assert over == {}, "split these functions (a test names what each part does)"
    mended = sorted(name for name, most in TOO_COMPLEX.items() if found.get(name, 0) <= MAX_COMPLEXITY)
    assert mended == [], "these no longer pass the limit: take them off TOO_COMPLEX"
