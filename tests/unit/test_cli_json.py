"""``--json`` on status, doctor and env (verify's is in test_checkpoint.py), and what the completion scripts know
(tests/integration/test_completion.py runs them in their shells)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmrt.cli import build_parser, main
from slurmrt.cli.completion import _commands


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> dict[str, object]:
    assert main(argv) == code
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == f"slurmrt.{argv[0]}/1" and document["slurmrt"]
    return document


def test_status_json_carries_the_runs_and_the_totals_of_the_text(tmp_path: Path, capsys) -> None:
    def ev(t: str, restart: int, event: str, **kw: object) -> dict[str, object]:
        return {"time": f"2026-11-21T10:{t}+00:00", "event": event, "job": "12", "restart": restart, "rank": 0, **kw}

    events = [ev("00:00", 0, "init"), ev("00:05", 0, "fresh_start"), ev("10:00", 0, "save", step=99, seconds=1.0),
              ev("15:00", 0, "decision", step=150, reasons=["deadline"]), ev("15:02", 0, "save", step=150,
                                                                                seconds=2.0),
              ev("15:03", 0, "exit", outcome="REQUEUED", step=150),
              ev("18:03", 1, "init"), ev("18:10", 1, "resume", step=150), ev("20:00", 1, "save", step=160,
                                                                                 seconds=1.0),
              ev("20:01", 1, "exit", outcome="FINISHED", step=160)]
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (job,) = _json(capsys, ["status", str(tmp_path), "--json"])["jobs"]
    assert job["job"] == "12" and job["restarts"] == 1 and job["in_job_restarts"] == 0
    first, second = job["runs"]
    assert (first["stop_step"], first["reasons"], first["outcome"]) == (150, ["deadline"], "REQUEUED")
    assert [c["step"] for c in first["checkpoints"]] == [99, 150] and second["resumed_from"] == 150
    assert second["gap_before_s"] == pytest.approx(180.0) and job["totals"]["waiting_s"] == pytest.approx(180.0)
    assert job["totals"]["wall_s"] == pytest.approx(1201.0) and job["totals"]["save_s"] == pytest.approx(4.0)
    assert job["totals"]["checkpoints"] == 3 and job["totals"]["last_step"] == 160
    (tmp_path / "events-12.jsonl").write_text("")
    assert _json(capsys, ["status", str(tmp_path), "--json"], code=1)["jobs"][0]["runs"] == []


def test_doctor_and_env_json_say_what_the_text_says(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURMRT_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURMRT_KEEP_LAST", "0")  # init() would refuse it: doctor fails
    report = _json(capsys, ["doctor", "--json"], code=1)
    assert report["ok"] is False
    (bad,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert bad["check"] == "options" and "keep_last" in bad["text"]
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURMRT_KEEP_LAST", "2")
    env = _json(capsys, ["env", "--json", "--gpus-per-node", "0"])
    assert env["exports"]["MASTER_ADDR"] == "gpu07" and env["exports"]["NNODES"] == "2"
    assert env["exports"]["WORLD_SIZE"] == "2" and "CUDA_DEVICE_MAX_CONNECTIONS" not in env["exports"]


def test_the_completion_scripts_know_every_command_and_option() -> None:
    commands = _commands(build_parser())
    assert {"sim", "run", "status", "verify", "doctor", "env", "completion"} <= set(commands)
    assert "--json" in commands["status"][1] and "--spare-nodes" in commands["run"][1]
