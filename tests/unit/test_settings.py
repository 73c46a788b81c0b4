"""Each option is declared once, in the section of the package that uses it (``<package>/settings.py``); `Options`
is their composition, and only the composers hold it: a part is handed its package's section (``StopSection.of``), or
values. Read from the source as the layout test reads it: a module below the composers that names `Options` at all
(an import, an annotation of any parameter, an attribute) is a part handed the whole."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "slurmrt"
#: The composers: they build the parts from `Options` (init(), the Runtime facade and its parts' builder, each CLI
#: command for its own process, the package's re-export), and the composition itself.
COMPOSERS = ("runtime/facade.py", "runtime/startup.py", "runtime/parts.py", "options.py", "__init__.py", "cli/")
#: The simulator models Slurm: its job's ``requeue``, ``kill_wait_s`` and ``max_restarts`` are sbatch's and
#: slurm.conf's, not slurmrt's options of those names.
NOT_OPTIONS = ("sim/",)


def _composer(path: str) -> bool:
    return path.startswith(COMPOSERS)


def holders(sources: dict[str, str]) -> list[str]:
    """Modules outside the composers that name `Options`: imported, in an annotation, or as an attribute."""
    found = []
    for path, source in sources.items():
        if _composer(path):
            continue
        tree = ast.parse(source)
        named = any((isinstance(n, ast.Name) and n.id == "Options")
                    or (isinstance(n, ast.Attribute) and n.attr == "Options")
                    or (isinstance(n, ast.alias) and n.name == "Options") for n in ast.walk(tree))
        strings = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.strip() in
                      {"Options", "Options | None"} for n in ast.walk(tree))
        found += [path] if named or strings else []
    return sorted(found)


def _section_fields(tree: ast.Module) -> dict[str, list[str]]:
    """Each section's fields (a class deriving from ``Section``)."""
    return {cls.name: [f.target.id for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                       and "ClassVar" not in ast.unparse(f.annotation)]
            for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
            and any(ast.unparse(b) == "Section" for b in cls.bases)}


def unread(sources: dict[str, str]) -> list[str]:
    """Fields of a section that nothing reads as an attribute (``<anything>.field``) in its own package or in a
    composer: an option declared and never used."""
    missing = []
    for path, source in sources.items():
        package = path.split("/")[0] + "/"
        readers = [ast.parse(s) for p, s in sources.items()
                   if p != path and (p.startswith(package) or _composer(p))]
        read = {n.attr for tree in readers for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for name, fields in _section_fields(ast.parse(source)).items():
            missing += [f"{name}.{field}" for field in fields if field not in read]
    return sorted(missing)


def projections(sources: dict[str, str], options: set[str]) -> list[str]:
    """Classes outside the sections that declare two or more fields named as options: a second declaration."""
    found = []
    for path, source in sources.items():
        if path.endswith("settings.py") or path.startswith(NOT_OPTIONS):
            continue
        for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
            own = [f.target.id for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]
            twice = [f for f in own if f in options]
            found += [f"{path}:{cls.name}({', '.join(twice)})"] if len(twice) >= 2 else []
    return sorted(found)


def _package() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.rglob("*.py")}


def _options() -> set[str]:
    from dataclasses import fields

    from slurmrt.options import Options

    return {f.name for f in fields(Options)}


def test_no_module_below_the_composers_holds_the_whole_options() -> None:
    assert holders(_package()) == [], "hand the part its package's section (Section.of), or the values it needs"


def test_every_option_of_a_section_is_read_by_its_package_or_a_composer() -> None:
    assert unread(_package()) == []


def test_no_class_declares_options_a_second_time() -> None:
    assert projections(_package(), _options()) == [], "take the section whole instead of copying its fields"


def test_the_settings_guards_catch_what_they_guard() -> None:
    planted = {
        "stop/settings.py": "class PartSection(Section):\n    used: int\n    idle: float\n",
        "stop/part.py": "class Part:\n    def __init__(self, s: PartSection) -> None:\n        self.n = s.used\n",
        "recovery/facts.py": "class Facts:\n    @classmethod\n    def of(cls, options: 'Options') -> None:\n"
                             "        pass\n",
        "hang/copy.py": "from dataclasses import dataclass\n@dataclass\nclass HangCopy:\n    hang_floor_s: float\n"
                        "    census_wait_s: float\n    other: int\n",
        "checkpoint/reader.py": "def f(rt):\n    return rt.options.Options\n",
        "runtime/facade.py": "from ..options import Options\nclass Runtime:\n"
                             "    def __init__(self, o: Options) -> None:\n        pass\n",
        "cli/run.py": "from ..options import Options\nx = Options.resolve({}, {}).idle_elsewhere\n",
    }
    # a parameter of any method, a string annotation and an attribute count; the composers may
    assert holders(planted) == ["checkpoint/reader.py", "recovery/facts.py"]
    assert unread(planted) == ["PartSection.idle"]  # read in the cli would not do: the cli reads idle_elsewhere
    assert projections(planted, {"hang_floor_s", "census_wait_s", "used", "idle"}) == [
        "hang/copy.py:HangCopy(hang_floor_s, census_wait_s)"]


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

    from slurmrt.options import SECTIONS, Options

    assert declared_twice(SECTIONS) == []
    declared = {f.name for section in SECTIONS for f in fields(section)}
    assert {f.name for f in fields(Options)} == declared
    assert not Options.__dict__.get("__annotations__"), "Options declares nothing of its own: a section does"
    assert set(Options.__mro__[1:1 + len(SECTIONS)]) == set(SECTIONS)
    assert all("rule" in f.metadata for f in fields(Options))


def test_a_section_is_picked_from_the_options_whole_and_is_where_its_package_says() -> None:
    """``Section.of`` picks a package's section from `Options` (same names, same values); each section lives in the
    package of the part that uses it."""
    from dataclasses import fields

    from slurmrt.options import SECTIONS, Options

    options = Options(checkpoint_dir="/ckpt", hang_floor_s=7.0, straggler="exclude")  # type: ignore[arg-type]
    for section in SECTIONS:
        picked = section.of(options)
        assert all(getattr(picked, f.name) == getattr(options, f.name) for f in fields(section)), section.__name__
        assert section.__module__.endswith(".settings"), section.__module__
    packages = {section.__module__.split(".")[1] for section in SECTIONS}
    assert packages == {"checkpoint", "stop", "hang", "health", "recovery", "record", "launch"}


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


def test_the_recovery_facts_hold_the_recovery_section_whole() -> None:
    from slurmrt.recovery.facts import POLICY, Facts
    from slurmrt.recovery.settings import RecoverySection

    assert Facts().policy == RecoverySection()
    assert POLICY == ("requeue", "max_restarts", "max_futile_runs", "max_excluded_nodes")


def test_the_launch_sections_shape_options_are_the_declared_shapes_fields() -> None:
    """Each field of the job's declared shape is an option of its own (``tp=2``, ``SLURMRT_TP``), with a rule, and so
    is Megatron-LM's command line: a field added to the shape without a rule would be refused as unknown."""
    from dataclasses import fields

    from slurmrt.launch.parallel import ParallelConfig
    from slurmrt.launch.settings import LaunchSection

    assert set(LaunchSection.SHAPE) == {f.name for f in fields(ParallelConfig)} | {"megatron_args"}
