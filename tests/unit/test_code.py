"""What ran (slurmrt.record.code): the script's hash, the command line cut to its bound, the versions, and what
`slurmrt status` says changed between two runs. git itself is read in tests/integration/test_code_record.py."""

from __future__ import annotations

from pathlib import Path

from slurmrt.record.code import MAX_SCRIPT_BYTES, changes, what_ran


def test_the_script_is_named_absolute_and_hashed_and_the_versions_are_said(tmp_path: Path,
                                                                           monkeypatch: object) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    got = what_ran([str(script), "--lr", "3e-4"])
    assert got["script"] == str(script) and len(got["sha256"]) == 16 and got["argv"][1:] == ["--lr", "3e-4"]
    assert got["python"].count(".") == 2 and got["slurmrt"] and got["torch"]
    script.write_text("print('bye')\n")
    assert what_ran([str(script)])["sha256"] != got["sha256"]


def test_no_file_a_huge_file_and_a_huge_command_line_are_bounded(tmp_path: Path) -> None:
    assert what_ran(["-c"])["sha256"] is None and what_ran([])["script"] == ""
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(MAX_SCRIPT_BYTES + 1)
    assert what_ran([str(big)])["sha256"] is None
    said = what_ran(["x.py", *["y" * 1000] * 100])["argv"]
    assert sum(map(len, said)) <= 4096 and len(said) <= 6


def test_the_changes_between_two_runs_are_said_in_words() -> None:
    a = {"script": "/w/train.py", "sha256": "aaaa", "git": {"commit": "1" * 40, "dirty": False}, "argv": ["x"],
         "python": "3.11.7", "torch": "2.13.0", "slurmrt": "0.1.0"}
    assert changes(a, dict(a)) == [] and changes(None, a) == [] and changes(a, {"garbage": 1}) != []
    b = {**a, "sha256": "bbbb", "git": {"commit": "2" * 40, "dirty": True}, "torch": "2.14.0"}
    assert changes(a, b) == ["train.py edited (aaaa -> bbbb)", "git 1111111111 -> 2222222222 (dirty)",
                             "torch 2.13.0 -> 2.14.0"]
    assert changes(a, {**a, "script": "/w/other.py"})[0] == "script /w/train.py -> /w/other.py"
    assert changes(a, {**a, "git": "not a mapping"}) == []
