"""In-job restart: the request a failed step leaves (recovery/injob.py, through the executor), and `slurmrt run`'s
loop (recovery/supervisor.py) with a stand-in for srun at the process boundary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurmrt._errors import ConfigError
from slurmrt.record.events import Event, EventLog, read_events, runs
from slurmrt.recovery import injob
from slurmrt.recovery.executor import Executor
from slurmrt.recovery.facts import Facts, InJob, in_job_from_environ
from slurmrt.recovery.plan import Action, Trigger
from slurmrt.recovery.policy import ExitCode
from slurmrt.recovery.supervisor import Placement, Supervisor, place, srun_command, tasks_per_node


def supervised(tmp_path: Path, *, attempt: int = 0, spares: tuple[str, ...] = ("n3",), most: int = 3) -> InJob:
    d = tmp_path / "run"
    d.mkdir(mode=0o700, exist_ok=True)
    return InJob(d, attempt, spares, most)


def request(sup: InJob, events: EventLog, bad: list[str], code: ExitCode, *, node: str, why: str = "") -> str | None:
    """What a rank that names ``bad`` nodes asks for under `slurmrt run` (not a Slurm job here: no requeue after a
    refusal); the exit's words when an in-job restart was asked for, else None."""
    trigger = Trigger.UNHEALTHY if code is ExitCode.UNHEALTHY else Trigger.HANG
    done = Executor(Facts(in_job=sup), events, node=node).recover(trigger, nodes=bad, detail=why)
    if done.action is not Action.IN_JOB_RESTART:
        return None
    return [e for e in read_events(events.path) if e["event"] == "exit"][-1]["why"]  # type: ignore[arg-type]


def refusals(path: Path) -> list[dict[str, object]]:
    return [e for e in read_events(path) if e["event"] == "in_job_refused"]


def log(tmp_path: Path, attempt: int = 0) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", job="7", restart=0, rank=0, attempt=attempt)


def test_a_request_names_the_nodes_and_is_recorded_with_the_exit(tmp_path: Path) -> None:
    sup = supervised(tmp_path)
    said = request(sup, log(tmp_path), ["n2"], ExitCode.HUNG, node="n1", why="rank 1 lost")
    assert said == "in-job restart 1: a new step without n2"
    assert injob.read_request(sup.directory, 0) == {"attempt": 0, "exclude": ["n2"], "code": 5, "node": "n1",
                                                    "why": "rank 1 lost"}
    ev = list(read_events(tmp_path / "events.jsonl"))
    assert [e["event"] for e in ev] == ["in_job_restart", "exit"]
    assert ev[0]["nodes"] == ["n2"] and ev[0]["spares"] == ["n3"] and ev[0]["next_attempt"] == 1
    assert ev[1]["outcome"] == "HUNG" and ev[1]["code"] == 5
    # A second rank of the same node (a failed health check) finds the request made: no requeue either.
    assert request(sup, log(tmp_path), ["n2"], ExitCode.UNHEALTHY, node="n2") is not None


@pytest.mark.parametrize(("bad", "sup_args", "why"), [
    ([], {}, "no node was named"),
    (["n2"], {"attempt": 3, "most": 3}, "the limit (--max-in-job-restarts) is 3"),
    (["n2", "n4"], {"spares": ("n3",)}, "2 node(s) to replace (n2, n4) but 1 spare(s) left (n3)"),
    (["n2"], {"spares": ()}, "but 0 spare(s) left"),
])
def test_refused_without_a_named_node_a_spare_or_restarts_left(tmp_path: Path, bad: list[str],
                                                                sup_args: dict[str, object], why: str) -> None:
    sup = supervised(tmp_path, **sup_args)  # type: ignore[arg-type]
    assert request(sup, log(tmp_path), bad, ExitCode.HUNG, node="n1") is None
    assert not list(sup.directory.iterdir()), "a refused request must leave nothing for the supervisor"
    (event,) = refusals(tmp_path / "events.jsonl")
    assert event["event"] == "in_job_refused" and why in event["why"]


def test_the_loop_guard_refuses_when_two_steps_in_a_row_committed_nothing_newer(tmp_path: Path) -> None:
    for attempt in (0, 1):  # both resumed from step 29 and saved nothing newer
        events = log(tmp_path, attempt)
        events.emit(Event.INIT)
        events.emit(Event.RESUME, step=29)
    sup = supervised(tmp_path, attempt=1)
    assert request(sup, log(tmp_path, 1), ["n3"], ExitCode.HUNG, node="n1") is None
    assert "the last 2 steps failed without a checkpoint newer" in refusals(tmp_path / "events.jsonl")[-1]["why"]
    # One futile step is not yet a loop.
    (tmp_path / "b").mkdir()
    sup0 = supervised(tmp_path / "b")
    events = log(tmp_path / "b")
    events.emit(Event.RESUME, step=29)
    assert request(sup0, events, ["n2"], ExitCode.HUNG, node="n1") is not None


def test_a_planted_or_open_directory_is_refused_and_the_requeue_takes_over(tmp_path: Path) -> None:
    sup = supervised(tmp_path)
    injob.request_path(sup.directory, 0).write_text('{"attempt": 0, "exclude": "n1"}')  # not ours, not valid
    assert request(sup, log(tmp_path), ["n2"], ExitCode.HUNG, node="n1") is None
    assert "not a request slurmrt wrote" in refusals(tmp_path / "events.jsonl")[-1]["why"]
    (tmp_path / "o").mkdir()
    open_dir = supervised(tmp_path / "o")
    os.chmod(open_dir.directory, 0o777)
    assert request(open_dir, log(tmp_path / "o"), ["n2"], ExitCode.HUNG, node="n1") is None
    assert "mode 0777" in refusals(tmp_path / "o" / "events.jsonl")[-1]["why"]
    assert not injob.request_path(open_dir.directory, 0).exists()


@pytest.mark.parametrize("text", ["", "[1]", '{"attempt": 1, "exclude": ["n2"]}', '{"attempt": 0, "exclude": []}',
                                  '{"attempt": 0, "exclude": [""]}', '{"attempt": 0, "exclude": [3]}', "{"])
def test_the_supervisor_reads_only_a_well_formed_request_of_this_attempt(tmp_path: Path, text: str) -> None:
    injob.request_path(tmp_path, 0).write_text(text)
    assert injob.read_request(tmp_path, 0) is None


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"SLURMRT_RUN_DIR": "relative"}, None),
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "one"}, None),
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "-1"}, None),
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "1", "SLURMRT_RUN_SPARES": "n3,n4",
      "SLURMRT_RUN_MAX_RESTARTS": "2"}, InJob(Path("/x"), 1, ("n3", "n4"), 2)),
])
def test_the_environment_of_slurmrt_run(env: dict[str, str], expected: InJob | None) -> None:
    assert in_job_from_environ(env) == expected


def test_runs_of_one_job_are_told_apart_by_their_in_job_attempt(tmp_path: Path) -> None:
    for restart, attempt in ((0, 0), (0, 1), (1, 0)):
        EventLog(tmp_path / "e.jsonl", job="7", restart=restart, rank=0, attempt=attempt).emit(Event.INIT)
    assert [r.label for r in runs(read_events(tmp_path / "e.jsonl"))] == ["0", "0.1", "1"]
    assert "attempt" not in next(iter(read_events(tmp_path / "e.jsonl")))  # old logs read as before


def test_placement_and_the_step_command() -> None:
    assert place(["n1", "n2", "n3"], [], 2) == Placement(("n1", "n2"), ("n3",))
    assert place(["n1", "n2", "n3"], ["n2"], 2) == Placement(("n1", "n3"), ())
    assert place(["n1", "n2", "n3"], ["n2", "n3"], 2) is None
    assert tasks_per_node({"SLURM_NTASKS_PER_NODE": "4"}) == 4
    assert tasks_per_node({"SLURM_TASKS_PER_NODE": "2(x3)"}) == 2
    assert tasks_per_node({"SLURM_TASKS_PER_NODE": "junk"}) == 1
    assert srun_command("srun", Placement(("n1", "n3"), ()), 2, ["--gpus-per-task=1"], ["python", "t.py"]) == [
        "srun", "--kill-on-bad-exit=1", "--nodes=2", "--nodelist=n1,n3", "--ntasks=4", "--ntasks-per-node=2",
        "--gpus-per-task=1", "python", "t.py"]


def test_too_many_spares_or_no_job_is_a_clear_error(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(ConfigError, match="--spare-nodes 2 with 2 node"):
        Supervisor(["true"], spare_nodes=2, max_restarts=3, env=env, directory=tmp_path / "d")
    with pytest.raises(ConfigError, match="run it in an sbatch script"):
        Supervisor(["true"], spare_nodes=0, max_restarts=3, env={}, directory=tmp_path / "d")


FAKE_SRUN = textwrap.dedent("""\
    #!{python}
    # Stands in for srun: records its argv and environment; the first step asks to leave out the second node of
    # its list, the next one ends with the code in FAKE_CODE; an --overlap call is the signal forwarding.
    import json, os, sys, time
    log = os.environ["FAKE_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "attempt": os.environ.get("SLURMRT_RUN_ATTEMPT"),
                            "spares": os.environ.get("SLURMRT_RUN_SPARES")}}) + "\\n")
    if "--overlap" in sys.argv:  # `slurmrt signal` on each node: fails (none registered) FAKE_OVERLAP_FAILS times
        fails = os.environ.get("FAKE_OVERLAP_FAILS")
        if fails and len(open(log).read().splitlines()) <= 1 + int(fails):
            sys.exit(1)
        sys.exit(0)
    attempt = int(os.environ["SLURMRT_RUN_ATTEMPT"])
    nodes = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--nodelist=")][0]
    if attempt == 0 and os.environ.get("FAKE_NODE_FAILURE"):  # Slurm killed the step: nobody asked
        sys.exit(137)
    if attempt == 0 and not os.environ.get("FAKE_WAIT_FIRST"):
        with open(os.path.join(os.environ["SLURMRT_RUN_DIR"], "request-0.json"), "w") as f:
            json.dump({{"attempt": 0, "exclude": [nodes[1]]}}, f)
        sys.exit(137)
    if os.environ.get("FAKE_WAIT"):
        open(os.environ["FAKE_WAIT"], "w").close()
        while not os.path.exists(os.environ["FAKE_WAIT"] + ".go"):
            time.sleep(0.05)
    sys.exit(int(os.environ.get("FAKE_CODE", "0")))
""")


def fake_srun(tmp_path: Path) -> Path:
    path = tmp_path / "srun"
    path.write_text(FAKE_SRUN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_the_supervisor_replaces_a_failed_step_without_the_named_node(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "2",
           "FAKE_LOG": str(tmp_path / "log"), "FAKE_CODE": "3"}
    sup = Supervisor(["python", "train.py"], spare_nodes=1, max_restarts=3, env=env, directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == 3  # the last step's code
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert [c["attempt"] for c in calls] == ["0", "1"]
    assert [c["spares"] for c in calls] == ["n3", ""]
    assert "--nodelist=n1,n2" in calls[0]["argv"] and "--nodelist=n1,n3" in calls[1]["argv"]
    assert calls[1]["argv"][-2:] == ["python", "train.py"] and "--ntasks=4" in calls[1]["argv"]
    assert not (tmp_path / "d").exists(), "the supervisor's directory is removed at its end"


def test_a_stale_request_from_a_killed_supervisor_is_not_read_as_this_runs(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "request-1.json").write_text('{"attempt": 1, "exclude": ["n1"]}')
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log")}
    sup = Supervisor(["x"], spare_nodes=1, max_restarts=3, env=env, directory=d, srun=str(fake_srun(tmp_path)))
    assert sup.run() == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 2  # step 0, its replacement; no third step


def test_the_cli_passes_usr1_to_the_training_processes_of_the_step(tmp_path: Path) -> None:
    """`slurmrt run` as a process: USR1 becomes an `srun --overlap ... slurmrt signal USR1` on the step's nodes."""
    wait = tmp_path / "step1-running"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT": str(wait), "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(tmp_path)}
    fake_srun(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurmrt", "run", "--spare-nodes", "1", "--", "python", "t.py"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        while not wait.exists():  # the replacement step runs
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        while len((tmp_path / "log").read_text().splitlines()) < 3:
            assert proc.poll() is None
            time.sleep(0.05)
    finally:
        Path(str(wait) + ".go").touch()
    assert proc.wait(timeout=60) == 0
    forward = json.loads((tmp_path / "log").read_text().splitlines()[2])["argv"]
    assert forward[:2] == ["--overlap", "--jobid=7"] and "--nodelist=n1,n3" in forward
    assert forward[-4:] == ["signal", "SIGUSR1", "--job", "7"] and "--ntasks-per-node=1" in forward
    err = proc.stderr.read() if proc.stderr else ""
    assert "in-job restart 1" in err and "SIGUSR1: passed to the training processes on n[1,3]" in err


def test_the_batch_shell_is_recognised_by_slurms_copy_of_the_script(tmp_path: Path) -> None:
    from slurmrt.recovery.supervisor import under_batch_shell

    assert not under_batch_shell(os.getpid())
    copy = tmp_path / "job00042" / "slurm_script"
    copy.parent.mkdir()
    copy.write_text("sleep 30\n")
    shell = subprocess.Popen(["bash", str(copy)])
    try:
        while not Path(f"/proc/{shell.pid}/cmdline").read_bytes().startswith(b"bash"):  # not yet exec'd
            time.sleep(0.01)
        assert under_batch_shell(shell.pid)
    finally:
        shell.kill()
        shell.wait()


@pytest.mark.parametrize(("held", "expected_steps"), [("n[1,3]", 2), ("n[1-3]", 1)])
def test_a_node_that_left_the_allocation_is_replaced_though_nobody_could_ask(
        tmp_path: Path, held: str, expected_steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --no-kill, Slurm kills a failed node's step at once and drops the node from the job's NodeList (measured
    in docs/slurm.md): the supervisor reads it from `scontrol show job`."""
    scontrol = tmp_path / "scontrol"  # the whole allocation when step 0 starts, then what the job holds after it
    scontrol.write_text(f"#!/bin/sh\nif [ -e {tmp_path}/asked ]; then held='{held}'; else held='n[1-3]'; fi\n"
                        f"touch {tmp_path}/asked\n"
                        "echo \"JobId=7 JobName=x JobState=RUNNING NodeList=$held ReqNodeList=(null) "
                        "ExcNodeList=(null) NumNodes=3\"\n")
    scontrol.chmod(0o755)
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_NODE_FAILURE": "1", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    monkeypatch.setenv("PATH", env["PATH"])  # _slurm.run finds scontrol on this process's PATH
    sup = Supervisor(["x"], spare_nodes=1, max_restarts=3, env=env, directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == (0 if expected_steps == 2 else 137)
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert len(calls) == expected_steps
    if expected_steps == 2:
        assert "--nodelist=n1,n3" in calls[1]["argv"]


def test_local_tier_partners_and_the_step_chosen_across_nodes() -> None:
    from slurmrt.checkpoint.local import _choose, partner_of

    assert [partner_of(r, 4, 2) for r in range(4)] == [2, 3, 0, 1]  # the same local rank on the next node
    assert partner_of(0, 2, 2) is None  # one node: nowhere to replicate
    part = {"world_size": 2, "size": 1, "xxh3_64": "0"}
    node_a = {7: {0: part, 1: part}, 9: {0: part}}  # rank 0's node holds its own part and rank 1's replica
    node_b: dict[int, dict[int, dict[str, object]]] = {}  # rank 1's node was replaced: it holds nothing
    assert _choose([node_a, node_b], 2, None) == (7, [0, 0], [part, part])  # 9 lacks rank 1's part
    assert _choose([node_a, node_b], 2, 8) is None  # the shared tier has step 8: 7 is too old
    assert _choose([node_a, {7: {1: part}}], 2, None) == (7, [0, 1], [part, part])  # each reads its own
    assert _choose([{7: {0: {**part, "world_size": 4}}}, {7: {1: part}}], 2, None) is None  # another world size


def test_a_spare_that_left_the_job_is_not_given_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n3, the spare, failed while step 0 ran, whose ranks asked for an in-job restart: no node to go to, so the
    supervisor requeues the job without n2 itself (the ranks left that to it), instead of an srun on a lost node."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.log\n"
                        f"if [ -e {tmp_path}/asked ]; then held='n[1-2]'; else held='n[1-3]'; fi\n"
                        f"touch {tmp_path}/asked\n"
                        'echo "JobId=7 JobState=RUNNING NodeList=$held ExcNodeList=(null) NumNodes=3"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log")}
    sup = Supervisor(["x"], spare_nodes=1, max_restarts=3, env=env, directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == int(ExitCode.HUNG)
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # step 0 only
    calls = (tmp_path / "scontrol.log").read_text().splitlines()
    assert "requeue 7" in calls and "update JobId=7 ExcNodeList=n2" in calls


def test_a_signal_before_the_step_runs_is_passed_on_once_its_processes_have_registered(tmp_path: Path) -> None:
    """USR1 while no step runs (here: before the first) waits for the step; `slurmrt signal` finding no training
    process yet on a node (still importing torch) is tried again while the step runs."""
    wait = tmp_path / "step-running"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT": str(wait), "FAKE_WAIT_FIRST": "1", "FAKE_OVERLAP_FAILS": "1"}
    sup = Supervisor(["x"], spare_nodes=0, max_restarts=0, env=env, directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)), retry_s=0.01)
    sup._on_signal(signal.SIGUSR1, None)  # the handler, as Python calls it: no step yet
    assert sup._pending == [signal.SIGUSR1]

    def release() -> None:  # the step runs until both tries were made (or a minute, for a failing test to end)
        log, deadline = tmp_path / "log", time.monotonic() + 60
        while time.monotonic() < deadline and (
                not log.exists() or sum('"--overlap"' in line for line in log.read_text().splitlines()) < 2):
            time.sleep(0.01)
        Path(str(wait) + ".go").touch()

    import threading

    threading.Thread(target=release, daemon=True).start()
    assert sup.run() == 0
    overlaps = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines() if "--overlap" in line]
    assert len(overlaps) == 2 and all(o["argv"][-4:] == ["signal", "SIGUSR1", "--job", "7"] for o in overlaps)
