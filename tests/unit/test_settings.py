"""Each part is built from the settings it uses: no constructor below the facade takes the whole `Options`, and
every field of a part's settings (a dataclass named ``...Settings``) is read by the part, read from the source as the
layout test reads it. Each option is declared once, in one section (slurmrt.sections), and `Options` is their
composition."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"
#: The composers: they build the parts from `Options` (init(), the Runtime facade, the CLI commands).
COMPOSERS = {"runtime/facade.py", "runtime/startup.py"}


def _annotation(arg: ast.arg) -> str:
    return ast.unparse(arg.annotation) if arg.annotation is not None else ""


def _constructors(tree: ast.Module) -> dict[str, list[ast.arg]]:
    """Each class's ``__init__`` parameters."""
    found = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                found[cls.name] = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return found


def _sections(tree: ast.Module) -> dict[str, list[str]]:
    """Each settings section's fields (a class named ``...Settings``)."""
    return {cls.name: [f.target.id for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]
            for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) and cls.name.endswith("Settings")}


def wholesale(sources: dict[str, str]) -> list[str]:
    """Constructors outside the composers that take the whole `Options`."""
    return sorted(f"{path}:{cls}({arg.arg})" for path, source in sources.items() if path not in COMPOSERS
                  for cls, args in _constructors(ast.parse(source)).items() for arg in args
                  if _annotation(arg).split(".")[-1].strip("'\"") in {"Options", "Options | None"})


def unused(sources: dict[str, str]) -> list[str]:
    """Fields of a settings section that no class taking that section reads (as ``<anything>.field``)."""
    trees = {path: ast.parse(source) for path, source in sources.items()}
    sections = {name: fields for tree in trees.values() for name, fields in _sections(tree).items()}
    missing = []
    for name, fields in sections.items():
        readers = [cls for tree in trees.values() for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                   and any(name in _annotation(a) for a in _constructors(ast.Module([cls], [])).get(cls.name, []))]
        read = {n.attr for cls in readers for n in ast.walk(cls) if isinstance(n, ast.Attribute)}
        missing += [f"{name}.{field}" for field in fields if readers and field not in read]
        missing += [f"{name}: no part takes it"] if not readers else []
    return sorted(missing)


def _package() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.rglob("*.py")}


def test_no_part_below_the_composers_takes_the_whole_options() -> None:
    sources = _package()
    assert wholesale(sources) == [], "build the part from a settings section of its own"
    # the parts that have a section: at least these, each taken by the part it is for
    sections = {name for source in sources.values() for name in _sections(ast.parse(source))}
    assert {"StopSettings", "CheckpointSettings", "HangSettings"} <= sections


def test_every_setting_a_part_receives_is_read_by_it() -> None:
    assert unused(_package()) == []


def test_the_settings_guards_catch_what_they_guard() -> None:
    planted = {
        "stop/part.py": (
            "from dataclasses import dataclass\n"
            "@dataclass\nclass PartSettings:\n    used: int\n    idle: float\n"
            "class Part:\n    def __init__(self, settings: PartSettings) -> None:\n        self.n = settings.used\n"
            "class Greedy:\n    def __init__(self, topology: object, options: Options) -> None:\n        pass\n"
            "@dataclass\nclass OrphanSettings:\n    x: int\n"),
        "runtime/facade.py": "class Runtime:\n    def __init__(self, options: Options) -> None:\n        pass\n",
    }
    assert wholesale(planted) == ["stop/part.py:Greedy(options)"]  # the composer may
    assert unused(planted) == ["OrphanSettings: no part takes it", "PartSettings.idle"]


def declared_twice(sections: tuple[type, ...]) -> list[str]:
    """Options that more than one section declares (the composition would keep one of them without a word)."""
    from dataclasses import fields

    seen: dict[str, str] = {}
    twice = []
    for section in sections:
        for f in fields(section):
            if f.name in seen:
                twice.append(f"{f.name}: {seen[f.name]} and {section.__name__}")
            seen[f.name] = section.__name__
    return twice


def test_each_option_is_declared_once_with_its_rule_and_options_composes_the_sections() -> None:
    from dataclasses import fields

    from slurmrt.options import Options
    from slurmrt.sections import SECTIONS

    assert declared_twice(SECTIONS) == []
    declared = {f.name for section in SECTIONS for f in fields(section)}
    assert {f.name for f in fields(Options)} == declared
    assert not Options.__dict__.get("__annotations__"), "Options declares nothing of its own: a section does"
    assert set(Options.__mro__[1:1 + len(SECTIONS)]) == set(SECTIONS)
    assert all("rule" in f.metadata for f in fields(Options))


def test_each_part_picks_options_by_their_names_and_types() -> None:
    """A part's settings are options (same name, same type), so ``.of`` picks them from the whole."""
    from dataclasses import fields

    from slurmrt.hang.monitor import HangSettings
    from slurmrt.options import Options
    from slurmrt.runtime.controller import StopSettings
    from slurmrt.runtime.session import CheckpointSettings

    types = {f.name: str(f.type) for f in fields(Options)}
    options = Options(checkpoint_dir="/ckpt", hang_floor_s=7.0, straggler="exclude")  # type: ignore[arg-type]
    for part in (StopSettings, CheckpointSettings, HangSettings):
        assert {f.name: str(f.type) for f in fields(part)}.items() <= types.items(), part.__name__
        picked = part.of(options)
        assert all(getattr(picked, f.name) == getattr(options, f.name) for f in fields(part))
    assert HangSettings.of(options).hang_floor_s == 7.0 and StopSettings.of(options).straggler == "exclude"


def test_the_declared_once_guard_catches_an_option_declared_twice() -> None:
    from dataclasses import dataclass

    from slurmrt._rules import setting

    @dataclass(frozen=True, kw_only=True)
    class One:
        keep_last: int = setting(3, "count", least=1)

    @dataclass(frozen=True, kw_only=True)
    class Other:
        keep_last: int = setting(5, "count", least=1)
        new: bool = setting(False, "flag")

    assert declared_twice((One, Other)) == ["keep_last: One and Other"]


def test_the_recovery_facts_take_their_defaults_from_the_recovery_section() -> None:
    from dataclasses import fields

    from slurmrt.recovery.facts import Facts
    from slurmrt.sections import RecoverySection

    section = RecoverySection()
    assert all(getattr(Facts(), f.name) == getattr(section, f.name) for f in fields(RecoverySection))


def test_the_launch_sections_shape_options_are_the_declared_shapes_fields() -> None:
    """Each field of the job's declared shape is an option of its own (``tp=2``, ``SLURMRT_TP``), with a rule, and so
    is Megatron-LM's command line: a field added to the shape without a rule would be refused as unknown."""
    from dataclasses import fields

    from slurmrt.launch.parallel import ParallelConfig
    from slurmrt.sections import LaunchSection

    assert set(LaunchSection.SHAPE) == {f.name for f in fields(ParallelConfig)} | {"megatron_args"}
