"""The completion scripts of ``slurmrt completion``, run in the shells they are for."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from slurmrt.cli import main


def _bash_complete(script: str, words: list[str]) -> list[str]:
    line = " ".join(words)
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _slurmrt; "
             'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def test_bash_completes_commands_then_each_commands_options(capsys) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert _bash_complete(script, ["slurmrt", "st"]) == ["status"]
    assert _bash_complete(script, ["slurmrt", "status", "--j"]) == ["--json"]
    assert set(_bash_complete(script, ["slurmrt", "run", "--s"])) == {"--spare-nodes", "--srun-args", "--step-wait"}
    assert _bash_complete(script, ["slurmrt", "sim", "--", "--r"]) == []  # the job's command: file names


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_script_and_registers_the_completion(capsys) -> None:
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    probe = f"autoload -Uz compinit && compinit -u -D\n{script}\nprint -r -- ${{_comps[slurmrt]}}"
    done = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "_slurmrt", done.stderr
