"""The package's shape, checked on every run of the suite (and so by CI): floors of folders that import only
downwards, no import cycle, no module past 360 lines, a thin facade, no function more complex than 12 (radon's
measure, which counts boolean operators; ruff's C901 does not), and none above 10 without a ``# Shape:`` comment."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit  # required (pyproject's test extra): a guard that skips guards nothing

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"  # read, not imported: a cycle would fail the import

#: Bottom first: each floor's folders (and top-level modules) import only from their own floor or below; the
#: coordinators (runtime/) stand above the parts they coordinate. A new folder or top-level module must say where
#: it belongs. docs/architecture.md draws the same floors.
FLOORS = [
    # no slurmrt folder below; the options' rules (each package declares its section with them)
    ["_errors", "_figures", "_text", "_clock", "_env", "_slurm", "_safefs", "_tree", "_comm", "_flock", "_rules"],
    # the event log; the launch as Slurm describes it; the log lines, whose lock and prefix name the job and node
    ["record", "launch", "log"],
    ["stop"],  # the parts of an agreed stop: signals, the deadline, the kill switch, the agreement, stragglers
    ["health"],  # the training's own health: a loss or a norm not finite, a spike, agreed at a step
    ["checkpoint", "trackers"],  # the checkpoint store, its tiers and files
    ["recovery"],  # the one plan and its executor: requeue, in-job restart, exclusion, `slurmrt run`
    ["hang"],  # detection and naming (watchdog, census) and the response, which asks recovery
    ["options"],  # every package's section, composed
    ["runtime"],  # init(), the Runtime and the coordinators it builds
    ["__init__", "__main__", "cli", "sim", "integrations"],  # what users call
]

MAX_LINES = 360
#: The facade that init() returns: it forwards, the parts work.
FACADE = ("runtime/facade.py", 260)
MAX_COMPLEXITY = 12


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    return _imports_in(path.read_text(), _module(path), package=path.name == "__init__.py")


def _imports_in(source: str, module: str, *, package: bool = False) -> set[str]:
    """The slurmrt modules ``source`` (the module ``module``) imports: relative imports, ``from slurmrt.x import``
    and ``import slurmrt.x``, at any depth (inside functions too)."""
    base_package = module.split(".") if package else module.split(".")[:-1]
    if module == "__init__":
        base_package = []
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = base_package[: len(base_package) - (node.level - 1)]
            found |= _targets(".".join([*base, node.module]) if node.module else ".".join(base), node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "slurmrt":
            found |= _targets(node.module.partition(".")[2] if node.module else "", node.names)  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            found |= {a.name.partition(".")[2] for a in node.names if a.name.startswith("slurmrt.")}
    return {m for m in found if m}


def _targets(target: str, names: list[ast.alias]) -> set[str]:
    """`from . import cuda` imports a module; `from .x import name` module x."""
    found = set()
    for alias in names:
        candidate = f"{target}.{alias.name}" if target else alias.name
        is_module = (ROOT / candidate.replace(".", "/")).with_suffix(".py").exists() or \
            (ROOT / candidate.replace(".", "/")).is_dir()
        found.add(candidate if is_module else target)
    return found


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


def test_no_module_passes_360_lines_and_the_facade_stays_thin() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
    name, most = FACADE
    assert sizes[name] <= most, f"{name} has {sizes[name]} lines: build new parts elsewhere, forward to them"


def _blocks(source: str) -> dict[str, Any]:
    """Each function, method and nested function as radon reads it, by name; a closure is named inside its
    function (``outer.inner``), a method inside its class."""
    found: dict[str, Any] = {}

    def visit(block: Any, name: str) -> None:
        found[name] = block
        for method in getattr(block, "methods", []):  # a class's methods, each on its own
            visit(method, f"{name}.{method.name}")
        for inner in getattr(block, "closures", []):  # functions defined inside a function
            visit(inner, f"{name}.{inner.name}")

    for block in cc_visit(source):
        classname = getattr(block, "classname", None)
        visit(block, f"{classname}.{block.name}" if classname else block.name)
    return found


def _complexity(source: str) -> dict[str, int]:
    """Each function's, method's and nested function's cyclomatic complexity, as radon counts it (boolean
    operators included)."""
    return {name: block.complexity for name, block in _blocks(source).items()}


def test_no_function_passes_complexity_12_counting_boolean_operators() -> None:
    over = {f"{path.relative_to(ROOT)}:{name}": c for path in sorted(ROOT.rglob("*.py"))
            for name, c in _complexity(path.read_text()).items() if c > MAX_COMPLEXITY}
    assert over == {}, "split these functions (a test names what each part does)"


#: Above this, a function says in a ``# Shape:`` comment, between its docstring and its first statement, why its
#: shape is the clearest one (a dispatch over cases, a protocol's steps in order); below it, nothing to say.
EXPLAINED_ABOVE = 10


def _unexplained(source: str) -> list[str]:
    """The functions above ``EXPLAINED_ABOVE`` with no ``# Shape:`` comment in their head."""
    lines = source.splitlines()
    heads = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[1] if len(node.body) > 1 and isinstance(node.body[0], ast.Expr) and \
                isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str) \
                else node.body[0]
            heads[node.name, node.lineno] = lines[node.lineno - 1:first.lineno - 1]
    said = {key for key, head in heads.items() if any(line.strip().startswith("# Shape:") for line in head)}
    return [name for name, block in _blocks(source).items() if block.complexity > EXPLAINED_ABOVE
            and (key := (block.name, block.lineno)) in heads and key not in said]


def test_a_function_above_complexity_10_says_why_its_shape_is_the_clearest() -> None:
    unsaid = [f"{path.relative_to(ROOT)}:{name}" for path in sorted(ROOT.rglob("*.py"))
              for name in _unexplained(path.read_text())]
    assert unsaid == [], "simplify these, or say in a '# Shape:' comment after the docstring why this shape is clearest"


def test_the_shape_guard_wants_the_comment_in_the_head_of_the_function_it_explains() -> None:
    branches = "\n".join(f"    if a and b{i}: return {i}" for i in range(6))
    plain = f'def f(a, b0, b1, b2, b3, b4, b5):\n    """Doc."""\n{branches}\n'
    assert _unexplained(plain) == ["f"]
    said = plain.replace('"""Doc."""\n', '"""Doc."""\n    # Shape: six cases, one line each\n')
    assert _unexplained(said) == []
    late = plain + "    # Shape: said too late\n    return None\n"
    assert _unexplained(late) == ["f"]
    nested = "def outer():\n" + "\n".join("    " + line for line in plain.splitlines()) + "\n    return f\n"
    assert _unexplained(nested) == ["outer.f"]


def test_the_complexity_guard_counts_what_ruff_does_not_and_looks_inside_functions() -> None:
    """Five ifs and eight boolean operators: ruff's C901 says 6, radon 14, and the guard fails it, at the top level
    and as a closure inside a simple function."""
    body = "\n".join(f"    if a and b and c{i}: return {i}" for i in range(4))
    source = f"def f(a, b, c0, c1, c2, c3):\n{body}\n    return a or b\n"
    assert _complexity(source)["f"] > MAX_COMPLEXITY
    nested = "def outer():\n" + "\n".join("    " + line for line in source.splitlines()) + "\n    return f\n"
    assert _complexity(nested)["outer"] <= 2 and _complexity(nested)["outer.f"] > MAX_COMPLEXITY


def test_the_import_guard_reads_every_form_of_import() -> None:
    source = ("from ..record.events import Event\nfrom slurmrt.hang import monitor\nimport slurmrt.runtime.facade\n"
              "def late():\n    from slurmrt.cli.status import status\n")
    assert _imports_in(source, "stop.deadline") == {"record.events", "hang.monitor", "runtime.facade", "cli.status"}
    assert _floor(_unit("cli.status")) > _floor(_unit("stop.deadline"))  # so the floors test would fail it


def test_the_graph_the_guards_read_is_the_package() -> None:
    """A guard over an empty graph passes whatever the code does: the graph holds every module and their imports."""
    assert len(GRAPH) >= 100 and sum(len(i) for i in GRAPH.values()) >= 300, (len(GRAPH), GRAPH)
    assert {"runtime", "recovery", "hang", "stop", "checkpoint", "record", "launch"} <= set(FOLDERS)
    assert "recovery.plan" in GRAPH["recovery.executor"] and "record.events" in GRAPH["recovery.executor"]


#: The modules of stop/, hang/ and recovery/ that may read the environment: a process of their own, whose
#: environment is what it is started to read (the health check srun runs on a suspect node).
OWN_PROCESS = {"recovery/probe.py"}


def _environment_reads(source: str) -> list[int]:
    """The lines of ``source`` that read the process environment: ``os.environ``, ``os.getenv``, ``os.environb``
    or ``from os import environ``."""
    names = {"environ", "environb", "getenv"}
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                      and node.value.id == "os")
                  or (isinstance(node, ast.ImportFrom) and node.module == "os"
                      and {a.name for a in node.names} & names))


def test_stop_hang_and_recovery_read_no_environment_variable() -> None:
    """They are handed what they need (the options, the topology, the facts): built once, by init() or slurmrt run,
    from one reading of the environment."""
    reads = {f"{p.relative_to(ROOT)}:{line}" for folder in ("stop", "hang", "recovery")
             for p in sorted((ROOT / folder).rglob("*.py")) if str(p.relative_to(ROOT)) not in OWN_PROCESS
             for line in _environment_reads(p.read_text())}
    assert reads == set()
    assert _environment_reads("import os\nx = os.environ.get('A')\ny = os.getenv('B')\n") == [2, 3]
    assert _environment_reads("from os import environ\n") == [1]


def _exit_writers(source: str) -> list[int]:
    """The lines of ``source`` that emit an ``exit`` event (``.emit(Event.EXIT, ...)``)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call) and
            isinstance(node.func, ast.Attribute) and node.func.attr == "emit" and node.args and
            isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "EXIT"]


def test_the_recovery_executor_is_the_only_writer_of_the_exit_event() -> None:
    """How a run ends is decided by the plan and recorded by its executor: one exit event per run, one writer."""
    writers = {str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py")) if _exit_writers(p.read_text())}
    assert writers == {"recovery/executor.py"}
    assert _exit_writers("events.emit(Event.EXIT, code=0)\nevents.emit(Event.SAVE, step=1)\n") == [1]


#: Where Slurm's variables may be named as such: the launch, which reads them, and the simulator, which sets them.
SLURM_VOCABULARY = ("launch", "sim")


def _slurm_names(source: str) -> list[int]:
    """The lines of ``source`` with a string that is a Slurm variable's name or its start (``"SLURM_JOB_ID"``,
    ``f"SLURM_{name}"``): a read of the environment by name. Prose that names one (a message, a docstring) is not."""
    name = re.compile(r"SLURMD?_[A-Z0-9_]*")
    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and name.fullmatch(node.value)})


def test_only_the_launch_and_the_simulator_name_slurm_variables() -> None:
    """Every other part asks the launch for a value by its meaning (slurmvars.node_name, .end_time, ...): one place
    knows Slurm's names, its older spellings and how a malformed value is refused."""
    named = sorted(f"{p.relative_to(ROOT)}:{line}" for p in ROOT.rglob("*.py")
                   if p.relative_to(ROOT).parts[0] not in SLURM_VOCABULARY for line in _slurm_names(p.read_text()))
    assert named == []
    assert _slurm_names('x = env.get("SLURM_JOB_ID")\ny = f"SLURM_{n}"\nz = "SLURMD_NODENAME"\n') == [1, 2, 3]
    assert _slurm_names('raise E("set SLURM_JOB_ID")\n"""SLURM_NNODES is read."""\n') == []
