"""`slurmrt sim` answers every Slurm command slurmrt calls (issue 52, item 5): a command without a shim would ask the
machine's own Slurm, where there is one, about a job it has never heard of."""

from __future__ import annotations

import ast

import pytest

from slurmrt.sim import shims
from slurmrt.sim.state import SimState
from tests.integration.launch import ROOT

SLURM_COMMANDS = {"sacct", "sacctmgr", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sinfo", "sprio",
                  "squeue", "srun", "sshare", "sstat", "strigger"}


def _called() -> dict[str, list[str]]:
    """Each Slurm command named as a string constant in slurmrt's source outside the simulator: where."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "slurmrt").rglob("*.py")):
        if "sim" in path.relative_to(ROOT / "src" / "slurmrt").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in SLURM_COMMANDS:
                found.setdefault(node.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_slurm_command_slurmrt_calls_has_a_shim_in_the_simulator() -> None:
    called = _called()
    assert {"scontrol", "squeue", "sinfo", "srun"} <= set(called), called  # the scan sees what it must
    missing = {name: where for name, where in called.items() if name not in shims.SHIMS}
    assert missing == {}, f"slurmrt calls these, and slurmrt sim would pass them to the machine's Slurm: {missing}"


def test_the_scan_would_catch_a_command_without_a_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shims, "SHIMS", tuple(n for n in shims.SHIMS if n != "sinfo"))
    with pytest.raises(AssertionError, match="sinfo"):
        test_every_slurm_command_slurmrt_calls_has_a_shim_in_the_simulator()


def test_sinfo_says_the_simulated_partitions_size_and_refuses_the_rest(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Spec:
        nodes = 3

    monkeypatch.setattr(SimState, "from_env", classmethod(lambda cls: type("S", (), {
        "read_job": staticmethod(lambda: (Spec, {}))})()))
    assert shims.main(["sinfo", "-h", "-p", "sim", "-o", "%D"]) == 0
    assert capsys.readouterr().out.strip() == str(shims.PARTITION_NODES)
    assert shims.main(["sinfo", "-h", "-p", "gpu", "-o", "%D"]) == 1
    assert "unsupported" in capsys.readouterr().err
