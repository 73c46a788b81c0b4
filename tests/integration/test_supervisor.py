"""`slurmrt run`'s loop (recovery/supervisor.py) with a stand-in for srun (and scontrol) at the process boundary:
a failed step replaced without its node, a lost node, a stale request, the warning passed on."""

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

from slurmrt.launch.slurmvars import job_of
from slurmrt.record.events import EventLog, read_events
from slurmrt.recovery.policy import ExitCode
from slurmrt.recovery.supervisor import Supervisor
from slurmrt.recovery.word import Word, read_word


@pytest.fixture(autouse=True)
def _no_slurm_of_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor asks `scontrol show job` for the job's nodes: a stand-in that knows no job answers, unless a
    test puts its own first on PATH, so that no test asks the machine's own Slurm."""
    stubs = tmp_path / "no-slurm"
    stubs.mkdir()
    for name in ("scontrol", "squeue", "sinfo", "sbatch"):
        (stubs / name).write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
        (stubs / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")


FAKE_SRUN = textwrap.dedent("""\
    #!{python}
    # Stands in for srun: records its argv and environment; the first step asks to leave out the second node of
    # its list, the next one ends with the code in FAKE_CODE; an --overlap call is the signal forwarding.
    import json, os, sys, time
    log = os.environ["FAKE_LOG"]
    if "slurmrt.recovery.probe" in sys.argv:  # the health check of the suspects: FAKE_UNHEALTHY names failing
        # nodes (not logged)
        bad = os.environ.get("FAKE_UNHEALTHY", "").split(",")
        for node in [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--nodelist=")][0]:
            print(json.dumps({{"node": node, "failures": ["/dev/shm is not writable"] if node in bad else []}}))
        sys.exit(0)
    with open(log, "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "attempt": os.environ.get("SLURMRT_RUN_ATTEMPT"),
                            "spares": os.environ.get("SLURMRT_RUN_SPARES")}}) + "\\n")
    if "--overlap" in sys.argv:  # `slurmrt signal` on each node: fails (none registered) FAKE_OVERLAP_FAILS times
        fails = os.environ.get("FAKE_OVERLAP_FAILS")
        if fails and len(open(log).read().splitlines()) <= 1 + int(fails):
            sys.exit(1)
        sys.exit(0)
    attempt = int(os.environ["SLURMRT_RUN_ATTEMPT"])
    if os.environ.get("FAKE_FACTS"):  # what rank 0's init() leaves for slurmrt run: the options it resolved
        with open(os.path.join(os.environ["SLURMRT_RUN_DIR"], f"facts-{{attempt}}.json"), "w") as f:
            f.write(os.environ["FAKE_FACTS"].replace("ATTEMPT", str(attempt)))
    nodes = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--nodelist=")][0]
    if attempt == 0 and os.environ.get("FAKE_TASK_ENDED"):  # srun's line, then what a rank reads while the step runs
        print("srun: error: " + os.environ["FAKE_TASK_ENDED"], file=sys.stderr, flush=True)
        ended, deadline = os.path.join(os.environ["SLURMRT_RUN_DIR"], "ended-0.json"), time.time() + 60
        while not os.path.exists(ended) and time.time() < deadline:
            time.sleep(0.01)
        with open(log, "a") as f:
            f.write(json.dumps({{"ended": open(ended).read() if os.path.exists(ended) else None}}) + "\\n")
        sys.exit(137)
    if attempt == 0 and os.environ.get("FAKE_NODE_FAILURE"):  # Slurm killed the step: nobody asked
        sys.exit(137)
    if attempt == 0 and not os.environ.get("FAKE_WAIT_FIRST"):
        with open(os.path.join(os.environ["SLURMRT_RUN_DIR"], "request-0.json"), "w") as f:
            json.dump({{"attempt": 0, "exclude": [nodes[1]], "trigger": os.environ.get("FAKE_TRIGGER", "hang"),
                        "why": "named by the step"}}, f)
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


@pytest.mark.parametrize("unhealthy", [False, True])
def test_a_named_node_is_replaced_only_on_evidence_against_it(tmp_path: Path, unhealthy: bool) -> None:
    """The step's ranks name n2 (a suspect): healthy, the new step runs on the same nodes and the spare is kept;
    failing its health check, n3 replaces it. The decision and its evidence are in the event log either way."""
    from slurmrt.record.events import EventLog, read_events

    log = tmp_path / "events-7.jsonl"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "2",
           "FAKE_LOG": str(tmp_path / "log"), "FAKE_CODE": "3", "FAKE_UNHEALTHY": "n2" if unhealthy else ""}
    sup = Supervisor(["python", "train.py"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d", srun=str(fake_srun(tmp_path)),
                     event_log=lambda attempt: EventLog(log, job="7", restart=0, rank=-1, attempt=attempt))
    assert sup.run() == 3  # the last step's code
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert [c["attempt"] for c in calls] == ["0", "1"]
    assert "--nodelist=n1,n2" in calls[0]["argv"]
    assert calls[1]["argv"][-2:] == ["python", "train.py"] and "--ntasks=4" in calls[1]["argv"]
    decision = next(e for e in read_events(log) if e["event"] == "recovery")
    assert decision["evidence"][0]["node"] == "n2" and decision["action"] == "in_job_restart"
    if unhealthy:
        assert "--nodelist=n1,n3" in calls[1]["argv"]
        assert decision["class"] == "node_unhealthy" and decision["left_out"] == ["n2"]
    else:
        assert "--nodelist=n1,n2" in calls[1]["argv"]
        assert decision["class"] == "hang" and decision["left_out"] == [] and decision["kept"] == ["n1", "n2"]
    assert not (tmp_path / "d").exists(), "the supervisor's directory is removed at its end"


@pytest.mark.parametrize("spares", [1, 0])
def test_nodes_the_step_judged_itself_are_weighed_against_the_spares_by_slurmrt_run_alone(tmp_path: Path,
                                                                                          spares: int) -> None:
    """The step's ranks judged n2 themselves (it failed its start-up health check) and asked, without knowing the
    spares: with one, slurmrt run starts the new step on it; with none, it requeues the job without n2 itself, and
    says why (the one planner: the spare count never travelled down to the training)."""
    nodes = "n[1-3]" if spares else "n[1-2]"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": nodes, "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_TRIGGER": "unhealthy", "FAKE_CODE": "0"}
    log = tmp_path / "events-7.jsonl"
    sup = Supervisor(["x"], spare_nodes=spares, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d", srun=str(fake_srun(tmp_path)),
                     event_log=lambda attempt: EventLog(log, job="7", restart=0, rank=-1, attempt=attempt))
    code = sup.run()
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    if spares:
        assert code == 0 and len(calls) == 2 and "--nodelist=n1,n3" in calls[1]["argv"]
        assert not log.exists() or not [e for e in read_events(log) if e["event"] == "in_job_refused"]
        return
    assert code == int(ExitCode.UNHEALTHY) and len(calls) == 1  # no new step: the requeue (refused by the stub)
    ev = list(read_events(log))
    (refused,) = [e for e in ev if e["event"] == "in_job_refused"]
    assert refused["nodes"] == ["n2"] and "but 0 spare(s) left" in refused["why"]
    assert [e["action"] for e in ev if e["event"] == "exit"] == ["requeue"]
    assert [e["event"] for e in ev][-1] == "requeue"


@pytest.mark.parametrize(("code", "expected", "steps"), [(2, 2, 1), (127, 127, 1), (137, 5, 4), (139, 5, 4)])
def test_a_step_killed_unanswered_restarts_on_the_same_nodes_and_one_ending_on_a_code_of_its_own_ends_the_job(
        tmp_path: Path, code: int, expected: int, steps: int) -> None:
    """No node gone, nobody asked: tasks killed by a signal (srun's 128 + N) on nodes that pass their health check
    are a process fault: a new step on the same nodes, the spare kept, up to --max-in-job-restarts, then the
    requeue (HUNG). A code the program chose (a usage error, a missing command) ends the job with it: another run
    would fail the same way."""
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT_FIRST": "1", "FAKE_CODE": str(code)}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == expected
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert len(calls) == steps
    assert all("--nodelist=n1,n2" in c["argv"] for c in calls)
    assert all(c["spares"] is None for c in calls), "the spares stay with slurmrt run, the one planner"


def test_the_tasks_srun_saw_end_reach_the_steps_ranks_while_the_step_runs(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """srun's standard error passes through slurmrt run unchanged; its line for a task that ended is in the run
    directory before the step ends, where the step's ranks look while they take the census."""
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "2",
           "FAKE_LOG": str(tmp_path / "log"), "FAKE_TASK_ENDED": "n2: tasks 2-3: Killed"}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=1, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    sup.run()
    seen = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines() if '"ended"' in line]
    assert seen and seen[0]["ended"] is not None, "no ended-0.json while the step ran"
    assert json.loads(seen[0]["ended"]) == {"attempt": 0, "tasks": {"2": {"node": "n2", "how": "Killed"},
                                                                    "3": {"node": "n2", "how": "Killed"}}}
    assert "srun: error: n2: tasks 2-3: Killed\n" in capfd.readouterr().err


def test_a_task_that_init_found_misconfigured_ends_the_job_with_78_and_no_restart(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """init() refused the launch in task 0 (exit 78, before any event log) and srun then killed the others: the
    step's code (137) would read as a killed rank, restarted and requeued in a loop; srun's line says otherwise."""
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_TASK_ENDED": "n1: task 0: Exited with exit code 78"}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == ExitCode.CONFIG
    steps = [line for line in (tmp_path / "log").read_text().splitlines() if '"argv"' in line]
    assert len(steps) == 1, steps
    assert "task(s) 0 exited 78: slurmrt found the launch or an option misconfigured" in capfd.readouterr().err


def _answered(tmp_path: Path, *, code: int, outcome: str, rank: int, step_code: str,
              extra_env: dict[str, str] | None = None, **chosen: object) -> Supervisor:
    """A supervisor whose step ends with ``step_code`` after rank ``rank`` recorded ``outcome`` (``code``) for its
    run in the event log (the one the supervisor reads); ``chosen``: more fields of that exit event."""
    from slurmrt.record.events import Event, EventLog

    log = tmp_path / "events-7.jsonl"
    EventLog(log, job="7", restart=0, rank=rank).emit(Event.EXIT, code=code, outcome=outcome, why="the rank's",
                                                       lead=True, **chosen)
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT_FIRST": "1", "FAKE_CODE": step_code, **(extra_env or {})}
    return Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                      directory=tmp_path / "d",
                      srun=str(fake_srun(tmp_path)),
                      event_log=lambda attempt: EventLog(log, job="7", restart=0, rank=-1, attempt=attempt))


def test_a_step_killed_after_one_of_its_ranks_answered_is_left_to_that_answer(tmp_path: Path) -> None:
    """A rank recorded how the run ends (it requeued the job without the node, say) before srun ended the step with
    137: the supervisor requeues nothing more, and ends with the rank's code."""
    sup = _answered(tmp_path, code=5, outcome="HUNG", rank=1, step_code="137")
    assert sup.run() == 5
    exits = [line for line in (tmp_path / "events-7.jsonl").read_text().splitlines() if '"exit"' in line]
    assert len(exits) == 1  # no second answer


@pytest.mark.parametrize("made", [False, True])
def test_a_requeue_chosen_by_a_rank_killed_before_it_made_it_is_made_by_the_supervisor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: bool) -> None:
    """The chaos campaign (seed 308, trial 7): rank 0 stopped on SIGTERM and recorded its exit (REQUEUED), then a
    SIGKILL ended it before `scontrol requeue`, and the step with it (137). The supervisor let that answer stand and
    ended the job with exit 3: FAILED, not requeued. It now makes the requeue the rank chose, once."""
    from slurmrt.record.events import Event, EventLog

    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.log\n"
                        'echo "JobId=7 JobState=RUNNING NodeList=n[1-3] ExcNodeList=(null) NumNodes=3"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sup = _answered(tmp_path, code=3, outcome="REQUEUED", rank=0, step_code="137", action="requeue", exclude=[])
    if made:  # the rank requeued the job and recorded it: nothing is left to make
        EventLog(tmp_path / "events-7.jsonl", job="7", restart=0, rank=0).emit(Event.REQUEUE, done=True,
                                                                               message="requeued 7", lead=True)
    assert sup.run() == 3
    calls = (tmp_path / "scontrol.log").read_text().splitlines()
    assert ("requeue 7" in calls) is not made
    events = [json.loads(line) for line in (tmp_path / "events-7.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["exit", "requeue"]
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # no second step


def test_a_step_killed_by_a_late_signal_after_its_ranks_finished_ends_finished(tmp_path: Path) -> None:
    """The chaos campaign's signal storm: the ranks had finished (rank 0 recorded it) when a SIGTERM killed a task
    as it tore down, and srun ended the step with 143. The job ended failed; the training was done. Now the
    supervisor ends with the rank's answer, 0, and starts nothing more."""
    sup = _answered(tmp_path, code=0, outcome="FINISHED", rank=0, step_code="143")
    assert sup.run() == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # one step, no replacement, no requeue


def test_a_stale_request_from_a_killed_supervisor_is_not_read_as_this_runs(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "request-1.json").write_text('{"attempt": 1, "exclude": ["n1"]}')
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log")}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env), directory=d,
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 2  # step 0, its replacement; no third step


def test_the_cli_passes_usr1_to_the_training_processes_of_the_step(tmp_path: Path) -> None:
    """`slurmrt run` as a process: USR1 goes into the running step's word (the replacement step's, after n2 failed
    its health check), which its rank 0 reads; no process is signalled and no side step is started."""
    wait = tmp_path / "step1-running"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_UNHEALTHY": "n2",
           "FAKE_WAIT": str(wait), "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(tmp_path)}
    fake_srun(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurmrt", "run", "--spare-nodes", "1", "--", "python", "t.py"],
                            env=env, stderr=subprocess.PIPE, text=True)
    word = tmp_path / ".slurmrt-run-7" / "word-1.json"
    try:
        while not wait.exists():  # the replacement step runs
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        while "SIGUSR1" not in (read_word(word) or Word()).signals:
            assert proc.poll() is None
            time.sleep(0.05)
    finally:
        Path(str(wait) + ".go").touch()
    assert proc.wait(timeout=60) == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 2  # the two steps: no `srun --overlap`
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


@pytest.mark.parametrize(("held", "nodes"), [("n[1,3]", "n1,n3"), ("n[1-3]", "n1,n2")])
def test_a_node_that_left_the_allocation_is_replaced_though_nobody_could_ask(
        tmp_path: Path, held: str, nodes: str, monkeypatch: pytest.MonkeyPatch) -> None:
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
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    # n[1-3] still held: no node left, and nobody in the step asked: the step died unanswered (137) on healthy
    # nodes, a process fault: a new step on the same nodes, the spare kept (not the step's raw code, a job left dead)
    assert sup.run() == 0
    calls = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert len(calls) == 2 and f"--nodelist={nodes}" in calls[1]["argv"]


def test_a_node_lost_after_the_ranks_finished_leaves_the_job_finished(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos campaign (device, seed 301): the ranks had finished (rank 0 recorded it) when n2 failed and Slurm
    killed the step. The supervisor treated it as a failure: a new step, or the requeue, until the loop guard ended
    a finished training with exit 5. The ranks' answer stands: 0, no second step."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\nif [ -e {tmp_path}/asked ]; then held='n[1,3]'; else held='n[1-3]'; fi\n"
                        f"touch {tmp_path}/asked\n"
                        'echo "JobId=7 JobState=RUNNING NodeList=$held ExcNodeList=(null) NumNodes=3"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sup = _answered(tmp_path, code=0, outcome="FINISHED", rank=0, step_code="137",
                    extra_env={"FAKE_NODE_FAILURE": "1", "FAKE_WAIT_FIRST": ""})
    assert sup.run() == 0
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # step 0 only: no replacement, no requeue


def test_a_spare_that_left_the_job_is_not_given_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n3, the spare, failed while step 0 ran, whose ranks asked for an in-job restart and named n2, which fails its
    health check: no node to go to, so the supervisor requeues the job without n2 itself (the ranks left that to it),
    instead of an srun on a lost node."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.log\n"
                        f"if [ -e {tmp_path}/asked ]; then held='n[1-2]'; else held='n[1-3]'; fi\n"
                        f"touch {tmp_path}/asked\n"
                        'echo "JobId=7 JobState=RUNNING NodeList=$held ExcNodeList=(null) NumNodes=3"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_UNHEALTHY": "n2"}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    assert sup.run() == int(ExitCode.UNHEALTHY)
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # step 0 only
    calls = (tmp_path / "scontrol.log").read_text().splitlines()
    assert "requeue 7" in calls and "update JobId=7 ExcNodeList=n2" in calls


def test_a_signal_before_the_step_runs_is_in_its_word_with_the_jobs_times_when_it_starts(tmp_path: Path) -> None:
    """USR1 while no step runs (here: before the first) is in the step's word before the step starts, with the
    job's end time as squeue (outside any container) says it; the step reads both from the word, and a second
    USR1 is not passed twice."""
    wait = tmp_path / "step-running"
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT": str(wait), "FAKE_WAIT_FIRST": "1"}
    sup = Supervisor(["x"], spare_nodes=0, max_in_job_restarts=0, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)))
    sup.forwarder.times = lambda job: (1000.0, 2000.0 if job == "7" else None)
    sup._on_signal(signal.SIGUSR1, None)  # the handler, as Python calls it: no step yet
    sup._on_signal(signal.SIGUSR1, None)
    assert [s for s, _ in sup.forwarder.pending] == [signal.SIGUSR1, signal.SIGUSR1]
    seen: list[Word | None] = []

    def read() -> None:  # what the step sees while it runs
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not wait.exists():
            time.sleep(0.01)
        seen.append(read_word(tmp_path / "d" / "word-0.json"))
        Path(str(wait) + ".go").touch()

    import threading

    threading.Thread(target=read, daemon=True).start()
    assert sup.run() == 0
    assert seen and seen[0] is not None and seen[0].end == 2000.0 and seen[0].start == 1000.0
    assert list(seen[0].signals) == ["SIGUSR1"]
    assert not sup.forwarder.pending


def test_the_supervisor_records_in_the_event_log_the_training_resolved_in_code(tmp_path: Path) -> None:
    """The README's script passes checkpoint_dir= (and max_restarts=) to init(), which slurmrt run's environment does
    not know: init() leaves what it resolved in the run directory, and the supervisor's decisions land in that event
    log, under those options (it says that they differ from the environment's)."""
    from slurmrt.record.events import EventLog, read_events

    own, env_log = tmp_path / "ckpt" / "events-7.jsonl", tmp_path / "env" / "events-7.jsonl"
    facts = {"attempt": "ATTEMPT", "event_log": str(own), "checkpoint_dir": str(own.parent), "requeue": True,
             "max_restarts": 9, "max_futile_runs": 3, "max_excluded_nodes": 4}
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "FAKE_LOG": str(tmp_path / "log"),
           "FAKE_WAIT_FIRST": "1", "FAKE_CODE": "137", "FAKE_FACTS": json.dumps(facts).replace('"ATTEMPT"', "ATTEMPT")}
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=1, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)),
                     event_log=lambda attempt: EventLog(env_log, job="7", restart=0, rank=-1, attempt=attempt))
    assert sup.run() == 5  # killed twice on healthy nodes: the same nodes once (--max-in-job-restarts 1), then the end
    assert not env_log.exists(), "the environment's event log is not this training's"
    ev = list(read_events(own))
    decisions = [e for e in ev if e["event"] == "recovery"]
    assert [(d["class"], d["action"]) for d in decisions] == [("process", "in_job_restart"), ("process", "requeue")]
    assert [e["event"] for e in ev if e["event"] in ("requeue", "exit")][-2:] == ["exit", "requeue"]
    assert sup.facts is not None and sup.facts.policy.max_restarts == 9


@pytest.mark.parametrize("text", ["", "{", "[]", '{"attempt": 0}', '{"attempt": 0, "event_log": "rel/e.jsonl", '
                                  '"checkpoint_dir": null, "requeue": true, "max_restarts": null, '
                                  '"max_futile_runs": 3, "max_excluded_nodes": 4}',
                                  '{"attempt": 0, "event_log": null, "checkpoint_dir": null, "requeue": 1, '
                                  '"max_restarts": null, "max_futile_runs": 3, "max_excluded_nodes": 4}',
                                  # the right types, out of the options' rules: a limit of 0 futile runs would refuse
                                  # every requeue, a negative cap on excluded nodes means nothing
                                  '{"attempt": 0, "event_log": null, "checkpoint_dir": null, "requeue": true, '
                                  '"max_restarts": null, "max_futile_runs": 0, "max_excluded_nodes": 4}',
                                  '{"attempt": 0, "event_log": null, "checkpoint_dir": null, "requeue": true, '
                                  '"max_restarts": -1, "max_futile_runs": 3, "max_excluded_nodes": 4}',
                                  '{"attempt": 0, "event_log": null, "checkpoint_dir": null, "requeue": true, '
                                  '"max_restarts": null, "max_futile_runs": 3, "max_excluded_nodes": null}'])
def test_the_supervisor_ignores_options_a_training_did_not_write(tmp_path: Path, text: str) -> None:
    from slurmrt.recovery import injob

    injob.facts_path(tmp_path, 0).write_text(text)
    assert injob.read_facts(tmp_path, 0) is None


def test_the_options_a_training_shares_are_read_back_whole(tmp_path: Path) -> None:
    from slurmrt.recovery import injob
    from slurmrt.recovery.facts import InJob

    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    injob.share_facts(InJob(d, 2), {"event_log": tmp_path / "e.jsonl", "checkpoint_dir": None,
                                           "requeue": False, "max_restarts": 1, "max_futile_runs": None,
                                           "max_excluded_nodes": 2, "other": "ignored"})
    assert injob.read_facts(d, 2) == {"event_log": str(tmp_path / "e.jsonl"), "checkpoint_dir": None,
                                      "requeue": False, "max_restarts": 1, "max_futile_runs": None,
                                      "max_excluded_nodes": 2}
    assert injob.read_facts(d, 1) is None  # another attempt's


def test_relative_paths_a_training_shares_are_read_back_absolute(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # `--checkpoint-dir ckpt`, as users write it: the record was refused ("not what slurmrt writes"), and slurmrt run
    # then kept its judgement of a fault out of the training's event log
    from slurmrt.recovery import injob
    from slurmrt.recovery.facts import InJob

    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.chdir(tmp_path)
    injob.share_facts(InJob(d, 0), {"event_log": Path("ckpt/events-7.jsonl"), "checkpoint_dir": "ckpt",
                                           "requeue": True, "max_restarts": None, "max_futile_runs": 3,
                                           "max_excluded_nodes": 4})
    read = injob.read_facts(d, 0)
    assert read is not None and read["event_log"] == str(tmp_path / "ckpt" / "events-7.jsonl")
    assert read["checkpoint_dir"] == str(tmp_path / "ckpt")


def test_the_health_probe_checks_the_directory_the_training_resolved_not_the_environments(tmp_path: Path) -> None:
    """`checkpoint_dir=` in code reaches slurmrt run in the training's record; its health probe then checks that
    directory (it checked the environment's, or none: the record's path was dropped on the way)."""
    from slurmrt.recovery import injob
    from slurmrt.recovery.evidence import Evidence
    from slurmrt.recovery.facts import InJob

    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    env.pop("SLURMRT_CHECKPOINT_DIR", None)
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)), evidence=Evidence("srun", "7", env))
    (tmp_path / "d").mkdir(mode=0o700)
    injob.share_facts(InJob(tmp_path / "d", 0), {"event_log": None, "checkpoint_dir": tmp_path / "mine",
                                                        "requeue": True, "max_restarts": None,
                                                        "max_futile_runs": 3, "max_excluded_nodes": 4})
    assert sup.evidence is not None and sup.evidence.checkpoint_dir is None
    sup._learn(0)
    assert sup.evidence.checkpoint_dir == tmp_path / "mine"


def test_the_trainings_own_options_are_said_once_and_not_for_a_checkpoint_dir_set_in_code(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The README's pattern (checkpoint_dir in code, none in the environment) is no difference to report (it was
    said as one); a real one (requeue=False in code) is said at the first step, not again at every in-job restart."""
    from slurmrt.recovery import injob
    from slurmrt.recovery.facts import Facts, InJob

    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    env.pop("SLURMRT_CHECKPOINT_DIR", None)
    sup = Supervisor(["x"], spare_nodes=1, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                     directory=tmp_path / "d",
                     srun=str(fake_srun(tmp_path)), facts=Facts(job="7"))
    (tmp_path / "d").mkdir(mode=0o700)
    shared = {"event_log": tmp_path / "ckpt" / "events-7.jsonl", "checkpoint_dir": tmp_path / "ckpt",
              "requeue": True, "max_restarts": None, "max_futile_runs": 3, "max_excluded_nodes": 4}
    injob.share_facts(InJob(tmp_path / "d", 0), shared)
    sup._learn(0)
    assert "options differ" not in capfd.readouterr().err
    for attempt in (1, 2):
        injob.share_facts(InJob(tmp_path / "d", attempt), {**shared, "requeue": False})
        sup._learn(attempt)
    said = capfd.readouterr().err
    assert said.count("the training's own options differ from the environment's (requeue=False)") == 1, said
