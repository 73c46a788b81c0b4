"""In-job restart: the request a failed step leaves (recovery/injob.py, through the executor), and `slurmrt run`'s
loop (recovery/supervisor.py) with a stand-in for srun at the process boundary."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from slurmrt._errors import ConfigError
from slurmrt.launch.slurmvars import job_of
from slurmrt.record.events import Event, EventLog, read_events
from slurmrt.record.runs import runs
from slurmrt.recovery import injob
from slurmrt.recovery.executor import Executor
from slurmrt.recovery.facts import Facts, InJob, Spares, in_job_from_environ
from slurmrt.recovery.plan import Action, Trigger
from slurmrt.recovery.policy import ExitCode
from slurmrt.recovery.settings import RecoverySection
from slurmrt.recovery.supervisor import Placement, Supervisor, place, srun_command


def supervised(tmp_path: Path, *, attempt: int = 0, spares: tuple[str, ...] | None = ("n3",), most: int = 3) -> InJob:
    """A step as ``slurmrt run`` plans it (its spares and limit); ``spares=None``: as the training sees it."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700, exist_ok=True)
    return InJob(d, attempt, Spares(spares, most) if spares is not None else None)


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


def test_an_in_job_restart_under_way_is_said_at_info_not_as_a_requeued_exit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The fault was said where it was found; its answer, a new step, is not a warning, and the step's exit 3 is not
    a requeue (nothing is requeued)."""
    with caplog.at_level(logging.INFO, logger="slurmrt.recovery.executor"):
        assert request(supervised(tmp_path), log(tmp_path), ["n2"], ExitCode.HUNG, node="n1") is not None
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "slurmrt.recovery.executor"]
    assert said and all(level == logging.INFO for level, _ in said), said
    assert not any("REQUEUED" in message for _, message in said), said


def test_a_request_names_the_nodes_and_is_recorded_with_the_exit(tmp_path: Path) -> None:
    sup = supervised(tmp_path)
    said = request(sup, log(tmp_path), ["n2"], ExitCode.HUNG, node="n1", why="rank 1 lost")
    assert said == "in-job restart 1: a new step (suspects n2, to be judged)"  # by `slurmrt run`, from evidence
    assert injob.read_request(sup.directory, 0) == {"attempt": 0, "exclude": ["n2"], "code": 5, "node": "n1",
                                                    "why": "rank 1 lost", "trigger": "hang"}
    ev = list(read_events(tmp_path / "events.jsonl"))
    assert [e["event"] for e in ev] == ["in_job_restart", "exit"]
    assert ev[0]["nodes"] == ["n2"] and ev[0]["spares"] == ["n3"] and ev[0]["next_attempt"] == 1
    assert ev[1]["outcome"] == "HUNG" and ev[1]["code"] == 5
    # A second rank of the same node (a failed health check) finds the request made: no requeue either.
    assert request(sup, log(tmp_path), ["n2"], ExitCode.UNHEALTHY, node="n2") is not None


def test_the_training_reports_a_fault_to_slurmrt_run_whatever_the_spares_and_leaves_the_choice_to_it(
        tmp_path: Path) -> None:
    """Without the spares (the training's view) a fault that names more nodes than slurmrt run has spares, or comes
    after its limit, is still asked for: slurmrt run, the one planner, weighs them (and requeues)."""
    sup = supervised(tmp_path, attempt=5, spares=None)
    said = request(sup, log(tmp_path), ["n2", "n4"], ExitCode.UNHEALTHY, node="n1")
    assert said == ("in-job restart 6: a new step without n2, n4, or the requeue, as `slurmrt run` weighs its "
                    "spares")
    (event,) = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "in_job_restart"]
    assert "spares" not in event  # the training does not know them
    assert request(supervised(tmp_path, spares=None), log(tmp_path), [], ExitCode.UNHEALTHY, node="n1") is None


@pytest.mark.parametrize(("bad", "sup_args", "why", "code"), [
    ([], {}, "no node was named", ExitCode.UNHEALTHY),
    (["n2"], {"attempt": 3, "most": 3}, "the limit (--max-in-job-restarts) is 3", ExitCode.HUNG),
    (["n2", "n4"], {"spares": ("n3",)}, "2 node(s) to replace (n2, n4) but 1 spare(s) left (n3)",
     ExitCode.UNHEALTHY),
    (["n2"], {"spares": ()}, "but 0 spare(s) left", ExitCode.UNHEALTHY),
])
def test_refused_without_a_named_node_a_spare_or_restarts_left(tmp_path: Path, bad: list[str],
                                                                sup_args: dict[str, object], why: str,
                                                                code: ExitCode) -> None:
    """A failed health check names its node with evidence: it needs a spare. A hang's suspects need none until
    `slurmrt run` judges them (tests/unit/test_recovery_plan.py); only the limit refuses them here."""
    sup = supervised(tmp_path, **sup_args)  # type: ignore[arg-type]
    assert request(sup, log(tmp_path), bad, code, node="n1") is None
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


@pytest.mark.parametrize("text", ["", "[1]", '{"attempt": 1, "exclude": ["n2"]}',
                                  '{"attempt": 0, "exclude": [""]}', '{"attempt": 0, "exclude": [3]}', "{"])
def test_the_supervisor_reads_only_a_well_formed_request_of_this_attempt(tmp_path: Path, text: str) -> None:
    injob.request_path(tmp_path, 0).write_text(text)
    assert injob.read_request(tmp_path, 0) is None


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"SLURMRT_RUN_DIR": "relative"}, None),
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "one"}, None),
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "-1"}, None),
    # the spares and the limit are slurmrt run's own: they do not travel down (one planner)
    ({"SLURMRT_RUN_DIR": "/x", "SLURMRT_RUN_ATTEMPT": "1", "SLURMRT_RUN_SPARES": "n3,n4",
      "SLURMRT_RUN_MAX_RESTARTS": "2"}, InJob(Path("/x"), 1)),
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
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]"}
    assert job_of({**job, "SLURM_NTASKS_PER_NODE": "4"}).tasks_per_node == 4  # type: ignore[union-attr]
    assert job_of({**job, "SLURM_TASKS_PER_NODE": "2(x3)"}).tasks_per_node == 2  # type: ignore[union-attr]
    assert job_of(job).tasks_per_node == 1  # type: ignore[union-attr]
    assert srun_command("srun", Placement(("n1", "n3"), ()), 2, ["--gpus-per-task=1"], ["python", "t.py"]) == [
        "srun", "--kill-on-bad-exit=1", "--wait=120", "--nodes=2", "--nodelist=n1,n3", "--ntasks=4",
        "--ntasks-per-node=2", "--gpus-per-task=1", "python", "t.py"]
    assert "--wait=0" not in srun_command("srun", Placement(("n1",), ()), 1, [], ["x"], wait_s=0)


def test_too_many_spares_or_no_job_is_a_clear_error(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(ConfigError, match="--spare-nodes 2 with 2 node"):
        Supervisor(["true"], spare_nodes=2, max_in_job_restarts=3, env=env, slurm_job=job_of(env),
                   directory=tmp_path / "d")
    with pytest.raises(ConfigError, match="run it in an sbatch script"):
        Supervisor(["true"], spare_nodes=0, max_in_job_restarts=3, env={}, slurm_job=job_of({}),
                   directory=tmp_path / "d")


def test_local_tier_partners_and_the_step_chosen_across_nodes() -> None:
    from slurmrt.checkpoint.partners import choose, partner_of

    assert [partner_of(r, 4, 2) for r in range(4)] == [2, 3, 0, 1]  # the same local rank on the next node
    assert partner_of(0, 2, 2) is None  # one node: nowhere to replicate
    part = {"world_size": 2, "size": 1, "xxh3_64": "0"}
    node_a = {7: {0: part, 1: part}, 9: {0: part}}  # rank 0's node holds its own part and rank 1's replica
    node_b: dict[int, dict[int, dict[str, object]]] = {}  # rank 1's node was replaced: it holds nothing
    assert choose([node_a, node_b], 2, None) == (7, [0, 0], [part, part])  # 9 lacks rank 1's part
    assert choose([node_a, node_b], 2, 8) is None  # the shared tier has step 8: 7 is too old
    assert choose([node_a, {7: {1: part}}], 2, None) == (7, [0, 1], [part, part])  # each reads its own
    assert choose([{7: {0: {**part, "world_size": 4}}}, {7: {1: part}}], 2, None) is None  # another world size




def test_the_trainings_event_log_is_the_environments_when_both_name_one_file(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURMRT_CHECKPOINT_DIR=ckpt, as users set it: the environment's event log is relative, the training's is
    shared absolute. The same file is no difference to report ("the training's own options differ")."""
    monkeypatch.chdir(tmp_path)
    data = {"event_log": str(tmp_path / "ckpt" / "events-7.jsonl"), "checkpoint_dir": str(tmp_path / "ckpt"),
            "requeue": True, "max_restarts": None, "max_futile_runs": 3, "max_excluded_nodes": 4}
    facts = Facts(job="7", policy=RecoverySection(requeue=True, max_futile_runs=3, max_excluded_nodes=4))
    assert facts.learned(data, Path("ckpt/events-7.jsonl"))[1] == ""
    assert facts.learned(data, tmp_path / "ckpt" / "events-7.jsonl")[1] == ""
    assert facts.learned(data, Path("other/events-7.jsonl"))[1] == f"event log {tmp_path / 'ckpt' / 'events-7.jsonl'}"
    assert facts.learned(data, None)[1] == ""  # the environment named none: the training's checkpoint_dir in code


def test_every_kind_of_record_a_killed_supervisor_left_is_cleared_before_a_new_run_writes_its_own(
        tmp_path: Path) -> None:
    """The attempt restarts at 0 in every run of the job: a record of any kind left in the run directory (the
    supervisor SIGKILLed) would be read as this run's, or make this run's exclusive create fail. Every ``*_path``
    of the run directory's writers is one of the kinds cleared, so a new kind cannot be forgotten."""
    import inspect

    from slurmrt.recovery import injob as records
    from slurmrt.recovery import word

    writers = [f for m in (records, word) for name, f in inspect.getmembers(m, inspect.isfunction)
               if name.endswith("_path") and f.__module__ == m.__name__]
    assert len(writers) == len(records.KINDS)
    planted = {f(tmp_path, 0).name for f in writers} | {f(tmp_path, 3).name for f in writers}
    for name in planted:
        (tmp_path / name).write_text("{}")
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / "facts-1.json.d").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "word-7.json").symlink_to(elsewhere)  # a link where a record goes: the link is removed, not followed
    assert records.clear_records(tmp_path) == sorted(planted | {"word-7.json"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "facts-1.json.d", "notes.txt"]


def test_a_recovery_is_planned_once_and_a_refused_in_job_restart_carries_out_the_plans_own_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmrt.recovery import executor as executor_module
    from slurmrt.recovery.plan import plan

    calls: list[Trigger] = []

    def counted(trigger: Trigger, *args: object, **kwargs: object) -> object:
        calls.append(trigger)
        return plan(trigger, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(executor_module, "plan", counted)
    sup = supervised(tmp_path)
    planned = plan(Trigger.HANG, Facts(in_job=sup), nodes=["n2"])
    assert planned.action is Action.IN_JOB_RESTART and planned.fallback is not None
    assert planned.fallback.action is not Action.IN_JOB_RESTART and planned.fallback.fallback is None
    injob.request_path(sup.directory, 0).write_text("planted")  # the request cannot be left: the fallback
    done = Executor(Facts(in_job=sup), log(tmp_path), node="n1").recover(Trigger.HANG, nodes=["n2"])
    assert calls == [Trigger.HANG]
    assert (done.action, done.outcome, done.why) == (planned.fallback.action, planned.fallback.outcome,
                                                     planned.fallback.why)
    assert done.in_job_refused is not None and "not a request slurmrt wrote" in done.in_job_refused
