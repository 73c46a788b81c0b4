from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurmrt import ParallelConfig
from slurmrt.cli import main
from slurmrt.cli.doctor import doctor
from slurmrt.cli.env import env_exports
from slurmrt.cli.kill import kill
from slurmrt.cli.status import status, status_data


def test_hostnames_prints_one_host_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hostnames", "n[1-3],m7"]) == 0
    assert capsys.readouterr().out.split() == ["n1", "n2", "n3", "m7"]


def test_bad_hostlist_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hostnames", "n[3-1]"]) == 2
    assert "runs backwards" in capsys.readouterr().err


ALLOC = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NTASKS": "4"}


def test_env_exports_the_launch_variables_and_the_cuda_rule() -> None:
    lines = env_exports(ALLOC, ParallelConfig(tp=2), 8, 9)
    assert lines[:5] == ["export MASTER_ADDR=gpu01", lines[1], "export NNODES=4", "export GPUS_PER_NODE=8",
                         "export WORLD_SIZE=32"]
    assert lines[1].startswith("export MASTER_PORT=")
    assert lines[5] == "export CUDA_DEVICE_MAX_CONNECTIONS=1"
    assert env_exports(ALLOC, ParallelConfig(tp=2), 8, 10)[5].startswith("unset CUDA_DEVICE_MAX_CONNECTIONS")


def test_env_outside_an_allocation_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["env"]) == 2
    assert "inside a Slurm allocation" in capsys.readouterr().err


def test_doctor_recommends_a_signal_lead_from_the_measured_save_time(tmp_path: Path) -> None:
    (tmp_path / "events-9.jsonl").write_text(json.dumps({"event": "save", "seconds": 45.0}) + "\n")
    report = doctor({}, ParallelConfig(), events_dirs=[tmp_path])
    assert any("--signal=USR1@150" in line for line in report.lines)


def test_doctor_health_names_the_node_and_what_failed(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    env = {"SLURMD_NODENAME": "n7", "SLURMRT_CHECKPOINT_DIR": str(blocked / "ckpt")}  # under a file: not creatable
    report = doctor(env, ParallelConfig(), events_dirs=[], health_check=True)
    assert report.failed
    assert any("FAIL  health: n7: the checkpoint directory" in line and "--exclude=n7" in line
               for line in report.lines)
    env["SLURMRT_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    healthy = doctor(env, ParallelConfig(), events_dirs=[], health_check=True)
    assert not healthy.failed and any("health: n7:" in line and "pass" in line for line in healthy.lines)


def _write_events(path: Path, events: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_kill_creates_the_switch_and_names_the_jobs_that_watch_it(tmp_path: Path) -> None:
    switch = tmp_path / "STOP"
    _write_events(tmp_path / "events-12.jsonl", [
        {"time": "2026-11-21T10:00:00+00:00", "event": "init", "job": "12", "restart": 0, "rank": 0,
         "kill_switch": str(switch.resolve())}])
    watchers = kill(switch, events_dirs=[tmp_path])
    assert switch.exists() and len(watchers) == 1 and watchers[0].startswith("job 12")


def test_kill_into_a_missing_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kill", str(tmp_path / "nope" / "STOP")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_status_reports_runs_stops_checkpoints_and_lost_time(tmp_path: Path) -> None:
    def ev(t: str, restart: int, event: str, **kw: object) -> dict[str, object]:
        return {"time": f"2026-11-21T10:{t}+00:00", "event": event, "job": "12", "restart": restart, "rank": 0, **kw}

    _write_events(tmp_path / "events-12.jsonl", [
        ev("00:00", 0, "init"), ev("00:05", 0, "fresh_start"), ev("10:00", 0, "save", step=99, seconds=1.0),
        ev("15:00", 0, "decision", step=150, reasons=["deadline"]), ev("15:02", 0, "save", step=150, seconds=2.0),
        ev("15:03", 0, "exit", outcome="REQUEUED"),
        ev("18:03", 1, "init"), ev("18:10", 1, "resume", step=150), ev("20:00", 1, "save", step=160, seconds=1.0),
        ev("21:50", 1, "signal", signal="SIGTERM"),  # then SIGKILL: no exit event
    ])
    lines = status([tmp_path])
    assert lines[0].startswith("job 12: 2 run(s): 1 requeue(s), 0 in-job restart(s)")
    assert "stopped at step 150 (deadline); last checkpoint step 150; exit REQUEUED" in lines[1]
    assert "resumed after step 150" in lines[2] and "3m00s down between runs" in lines[2]
    assert "1m50s of work after the checkpoint kept" in lines[2]


@pytest.mark.stragglers  # a straggler event written by hand, not a false positive
def test_status_shows_the_in_job_restart_which_node_left_and_why(tmp_path: Path) -> None:
    def ev(t: str, event: str, rank: int = 0, attempt: int = 0, **kw: object) -> dict[str, object]:
        return {"time": f"2026-11-21T10:{t}+00:00", "event": event, "job": "12", "restart": 0, "rank": rank,
                **({"attempt": attempt} if attempt else {}), **kw}

    _write_events(tmp_path / "events-12.jsonl", [
        ev("00:00", "init"), ev("00:05", "fresh_start"), ev("01:00", "save", step=29, seconds=0.1),
        ev("01:30", "progress", step=34),
        ev("01:31", "straggler", step=34, straggler=3, node="n7", ratio=1.9, cost=0.45, action="name"),
        # rank 0 was the one lost: rank 1 led the response and asked for the new step
        ev("01:40", "hang", rank=1, step=34, where="all_reduce"),  # rank 1's own: not the run's
        ev("01:40", "in_job_restart", rank=1, nodes=["n1"], why="rank(s) 0 did not answer", next_attempt=1,
           lead=True),
        ev("01:40", "exit", rank=1, code=5, outcome="HUNG", step=34, lead=True),
        ev("01:50", "init", attempt=1), ev("01:55", "resume", attempt=1, step=29, tier="local", from_peers=1829),
        ev("03:00", "save", attempt=1, step=79, seconds=0.1), ev("03:01", "exit", attempt=1, outcome="FINISHED",
                                                                 step=79),
    ])
    lines = status([tmp_path], chart=False)
    assert lines[0].startswith("job 12: 1 run(s) in 2 step(s): 0 requeue(s), 1 in-job restart(s)")
    assert lines[1].startswith("  run 0: fresh start") and \
        "in-job restart without n1 (rank(s) 0 did not answer)" in lines[1] and "(at least 5 step(s))" in lines[1]
    assert "replaced by a new step in the job; reached step 34" in lines[1]
    assert "straggler rank 3 on n7 (1.90x slower, 45% of a step)" in lines[1]
    assert lines[2].startswith("  run 0.1: resumed after step 29 from the local tier (1829 bytes from other nodes)")
    assert "exit FINISHED; reached step 79" in lines[2]


def test_status_shows_slurmrt_runs_decision_for_each_attempt_in_one_line(tmp_path: Path) -> None:
    """The recovery event (slurmrt run's judgement) is the step's story: its class, its action, the nodes kept or
    left out; a suspect the ranks named but the evidence cleared is not said to be left out; --json carries it."""
    def ev(t: str, event: str, rank: int = 0, attempt: int = 0, **kw: object) -> dict[str, object]:
        return {"time": f"2026-11-21T10:{t}+00:00", "event": event, "job": "12", "restart": 0, "rank": rank,
                **({"attempt": attempt} if attempt else {}), **kw}

    _write_events(tmp_path / "events-12.jsonl", [
        ev("00:00", "init"), ev("00:05", "fresh_start"), ev("01:00", "save", step=29, seconds=0.1),
        ev("01:40", "in_job_restart", rank=1, nodes=["n2"], why="a new step (suspects n2, to be judged)",
           next_attempt=1, lead=True),
        ev("01:40", "exit", rank=1, code=5, outcome="HUNG", step=34, lead=True),
        ev("01:41", "recovery", rank=-1, trigger="rank_lost", evidence=[{"node": "n2", "in_job": True,
           "failures": [], "hangs_before": 0, "class": "process"}], action="in_job_restart", kept=["n1", "n2"],
           left_out=[], why="a new step on the same nodes: no node evidence against n2", lead=True,
           **{"class": "process"}),
        ev("01:50", "init", attempt=1), ev("01:55", "resume", attempt=1, step=29),
        ev("02:10", "recovery", attempt=1, rank=-1, trigger="node_gone", evidence=[{"node": "n2", "in_job": False,
           "failures": [], "hangs_before": 0, "class": "node_lost"}], action="requeue", kept=["n1"],
           left_out=["n2"], why="1 node(s) to replace (n2) but 0 spare(s) left", lead=True,
           **{"class": "node_lost"}),
        ev("02:10", "exit", attempt=1, rank=-1, code=5, outcome="HUNG", lead=True),
    ])
    lines = status([tmp_path], chart=False)
    assert "decision: process (rank_lost), in job restart on the same nodes (n1, n2)" in lines[1], lines[1]
    assert "replaced by a new step in the job" in lines[1] and "without n2" not in lines[1]
    assert "decision: node lost (node_gone), requeue without n2: 1 node(s) to replace (n2) but 0 spare(s) left" \
        in lines[2], lines[2]
    (job,) = status_data([tmp_path])
    assert [r["recovery"]["class"] for r in job["runs"]] == ["process", "node_lost"]


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ["hostnames", "hostlist", "sim", "run", "env", "doctor", "kill", "status", "verify", "nodes",
                    "signal", "completion"]:
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert "example" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "match"), [
    (["--forward", "KILL"], "SIGKILL cannot be passed on"),
    (["--forward", "USR1,STOP"], "SIGSTOP cannot be passed on"),
    (["--forward", "TERM"], "SIGTERM cannot be passed on"),
    (["--srun-args=--gpus-per-task='1"], "--srun-args .*No closing quotation"),
])
def test_slurmrt_run_refuses_a_signal_it_cannot_pass_on_and_unbalanced_srun_args(
        argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *argv, "--", "python", "train.py"]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_slurmrt_alone_prints_help_and_version_prints_the_one_version(capsys: pytest.CaptureFixture[str]) -> None:
    import slurmrt

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: slurmrt") and "status" in out and "nodes" in out
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"slurmrt {slurmrt.__version__}\n"


def test_kill_with_events_given_says_where_it_looked_not_to_pass_events(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ckpt").mkdir()
    assert main(["kill", str(tmp_path / "stop"), "--events", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert f"no event log in {tmp_path / 'ckpt'} mentions it" in out and "pass --events" not in out


def test_every_option_and_argument_has_help_and_no_help_shows_markup(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from slurmrt.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    without = [f"{name} {a.option_strings or a.dest}" for name, sub in commands.choices.items()
               for a in sub._actions if not a.help]
    assert without == []
    for name in commands.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text, name
        assert max(len(line) for line in text.splitlines()) <= 100, name  # wrapped, not one line per paragraph
