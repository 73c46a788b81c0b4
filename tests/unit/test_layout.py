"""The package's floors: a module imports only from its own floor or below, and the import graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"  # read, not imported: a cycle would fail the import

#: Bottom first. A module not listed here fails the test: a new module must say where it belongs.
FLOORS = [
    ["_errors", "_clock", "_env", "_slurm", "_safefs", "_tree"],
    ["_comm", "log", "launch.hostlist", "launch.launcher", "launch.ports", "stop.signals", "stop.pidfiles",
     "stop.straggler", "checkpoint._files", "checkpoint.sharded"],
    ["launch.parallel", "launch.topology", "stop.deadline", "stop.watcher", "stop.killswitch",
     "hang.census", "record.events", "record.experiment", "checkpoint.lease", "checkpoint.manifest",
     "checkpoint.background", "checkpoint.retention", "checkpoint.local", "checkpoint.parts", "checkpoint.helper"],
    ["launch.preflight", "launch.cuda", "launch.health", "stop.decision", "hang.watchdog", "checkpoint.store",
     "options", "trackers", "outcome.exclusion"],
    ["stop.agreement", "outcome.policy", "record.timeline"],
    ["_hooks", "record.report", "outcome.injob", "hang.response"],
    ["stop.controller", "hang.monitor", "checkpoint.session", "outcome.conclude", "launch.supervisor"],
    ["runtime"],
    ["__init__", "__main__", "cli", "sim", "integrations"],
]

def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _floor(module: str) -> int:
    for level, names in enumerate(FLOORS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return level
    if module in {"launch", "stop", "checkpoint", "hang", "outcome", "record"}:  # packages' __init__: docstrings
        return 0
    raise AssertionError(f"slurmrt.{module} has no floor in tests/unit/test_layout.py")


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


GRAPH = {_module(p): _imports(p) for p in ROOT.rglob("*.py")}


def test_every_import_goes_to_the_same_floor_or_below() -> None:
    upward = [f"{m} -> {i}" for m, imports in GRAPH.items() for i in imports if _floor(i) > _floor(m)]
    assert upward == []


def test_the_import_graph_has_no_cycle() -> None:
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in GRAPH.get(module, ()):
            visit(target, (*path, module))
        done.add(module)

    for module in GRAPH:
        visit(module, ())
