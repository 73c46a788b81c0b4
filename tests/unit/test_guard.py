"""The guard job (slurmrt.recovery.guard): armed by `slurmrt run`, it requeues a --no-kill job whose batch node failed
and only then. Slurm's commands are stood in at the process boundary (conftest.fake_slurm); the cluster scenario
(tests/slurm, test_14_the_batch_node_failing_...) runs the real thing."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from slurmrt.launch.slurmvars import Job
from slurmrt.record.events import Event, EventLog, read_events
from slurmrt.record.ledger import Ledger
from slurmrt.recovery.exclusion import JobNodes, parse_job
from slurmrt.recovery.facts import Facts
from slurmrt.recovery.guard import arm, armed, judge, stand_guard
from slurmrt.recovery.settings import RecoverySection
from tests.unit.conftest import fake_slurm

#: What `scontrol show job -o` said about a --no-kill job whose batch node n1 failed (test cluster, 2026-11-26).
FAILED = ("JobId=664 JobName=job.sh JobState=FAILED Reason=JobLaunchFailure Requeue=1 Restarts=1 ExitCode=0:9 "
          "Partition=low ExcNodeList=(null) NodeList=n[2-3] BatchHost=n1 NumNodes=2 StdOut=/tmp/exp/job-664.out")


def test_the_batch_host_restarts_and_output_are_read_from_scontrol() -> None:
    info = parse_job(FAILED)
    assert (info.batch_host, info.restarts, info.std_out, info.nodes) == ("n1", 1, "/tmp/exp/job-664.out",
                                                                          ("n2", "n3"))


def test_the_guard_requeues_only_a_job_that_lost_its_batch_node_and_answered_nothing() -> None:
    info = parse_job(FAILED)
    assert judge(info, restart=1, host="n1", answered=False) is None
    assert "had ended for good" in (judge(info, restart=1, host="n1", answered=True) or "")
    assert "was requeued after run 0" in (judge(info, restart=0, host="n1", answered=False) or "")
    kept = JobNodes((), 3, "low", ("n1", "n2", "n3"), "CANCELLED", "n1", 1)  # scancel: the node stayed
    assert "did not leave the job" in (judge(kept, restart=1, host="n1", answered=False) or "")
    for live in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING"):
        alive = JobNodes((), 2, "low", ("n2", "n3"), live, "n1", 1)
        assert "nothing to do" in (judge(alive, restart=1, host="n1", answered=False) or ""), live
    unknown = JobNodes((), None, None, None, "FAILED", None, None)
    assert "did not leave the job" in (judge(unknown, restart=1, host="n1", answered=False) or "")
    # Other evidence, where a Slurm keeps the node in the list: the job ended NODE_FAIL, or the node is down now.
    assert judge(kept, restart=1, host="n1", answered=False, host_state="DOWN*+DRAIN") is None
    assert judge(kept, restart=1, host="n1", answered=False, host_state="IDLE+NOT_RESPONDING") is None
    assert "not down (State=DRAIN)" in (judge(kept, restart=1, host="n1", answered=False, host_state="DRAIN") or "")
    assert judge(replace(kept, state="NODE_FAIL"), restart=1, host="n1", answered=False) is None


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "slurm.log"
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    monkeypatch.setenv("PATH", f"{fake_slurm(monkeypatch, tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    return log


def test_arming_cancels_the_earlier_runs_guard_and_submits_one_on_afternotok(slurm: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_SBATCH_ID", "901")
    job = Job("664", partition="low", account="proj")
    assert arm(job, "n1", events=EventLog(path, job="664", restart=0, rank=-1), output=None) == "901"
    monkeypatch.setenv("FAKE_SBATCH_ID", "905")
    assert arm(dataclasses.replace(job, restart_count=1), "n1", events=EventLog(path, job="664", restart=1, rank=-1),
               output="/o/job.out") == "905"
    calls = slurm.read_text().splitlines()
    sbatch = [c.split() for c in calls if c.startswith("sbatch")]
    assert len(sbatch) == 2 and "scancel 901" in calls and calls.index("scancel 901") < calls.index(" ".join(sbatch[1]))
    first = sbatch[0]
    for expected in ("--dependency=afternotok:664", "--kill-on-invalid-dep=yes", "--partition=low", "--account=proj",
                     "--output=/dev/null", "--nodes=1"):
        assert expected in first, first
    assert "--output=/o/job.out" in sbatch[1] and first[-6:] == ["guard", "664", "--restart", "0", "--batch-host",
                                                                 "n1"]
    assert armed(path, "664") == ["901", "905"] and armed(path, "665") == []


def test_a_guard_that_cannot_be_submitted_costs_a_warning_and_nothing_else(slurm: Path, tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "events.jsonl"
    assert arm(Job("664"), "n1", events=EventLog(path, job="664", restart=0, rank=-1), output=None) is None
    assert "QOSMaxSubmitJobPerUserLimit" in caplog.text and "without a requeue" in caplog.text
    (event,) = [e for e in read_events(path) if e["event"] == "guard"]
    assert event["guard"] is None and armed(path, "664") == []


def _stand(tmp_path: Path, ledger: Ledger, **policy: object) -> int:
    path = tmp_path / "events.jsonl"
    facts = Facts(job="664", restart_count=1, policy=RecoverySection(**policy))  # type: ignore[arg-type]
    return stand_guard("664", 1, "n1", facts=facts, ledger=ledger,
                       event_log=lambda attempt: EventLog(path, job="664", restart=1, rank=-1, attempt=attempt))


def test_the_guard_requeues_without_the_batch_node_and_remembers_it(slurm: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JOB_INFO", FAILED)
    path = tmp_path / "events.jsonl"
    step = EventLog(path, job="664", restart=1, rank=0, attempt=1)  # run 1 reached its second step, then n1 died
    step.emit(Event.INIT)
    ledger = Ledger(tmp_path / "ledger.json")
    assert _stand(tmp_path, ledger) == 0
    assert "requeue 664" in slurm.read_text() and "ExcNodeList=n1" in slurm.read_text()
    (ended,) = [e for e in read_events(path) if e["event"] == "exit"]
    assert (ended["by"], ended["attempt"], ended["code"], ended["rank"]) == ("guard", 1, 5, -1)
    assert ledger.nodes() == ["n1"]


@pytest.mark.parametrize(("code", "outcome", "action"), [(4, "STOPPED", "stop"), (0, "FINISHED", "finish"),
                                                        (5, "HUNG", "fail")])  # a hang whose requeue was refused
def test_the_guard_leaves_a_run_that_recorded_its_end_for_good(slurm: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, code: int,
                                                               outcome: str, action: str) -> None:
    """Ended for good is the exit event's action (Action.for_good), not its code: exit 5 with the requeue refused
    (max_restarts, the loop guard) ended the job as surely as a stop."""
    monkeypatch.setenv("FAKE_JOB_INFO", FAILED)
    EventLog(tmp_path / "events.jsonl", job="664", restart=1, rank=0).emit(Event.EXIT, code=code, outcome=outcome,
                                                                         action=action)
    assert _stand(tmp_path, Ledger(tmp_path / "ledger.json")) == 0
    assert "requeue" not in slurm.read_text()


def test_the_guard_obeys_the_loop_guard_and_max_restarts(slurm: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JOB_INFO", FAILED)
    assert _stand(tmp_path, Ledger(tmp_path / "ledger.json"), max_restarts=1) == 5  # restart 1 of at most 1
    assert "requeue" not in slurm.read_text()
    (ended,) = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "exit"]
    assert "max_restarts=1" in ended["why"] and json.dumps(ended["by"]) == '"guard"'


def test_a_step_that_asked_for_an_in_job_restart_is_requeued_when_the_batch_node_dies_before_the_next(
        slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its exit event (5, an in-job restart asked) wanted the job to go on: not an answer that stands."""
    monkeypatch.setenv("FAKE_JOB_INFO", FAILED)
    EventLog(tmp_path / "events.jsonl", job="664", restart=1, rank=0).emit(Event.EXIT, code=5, outcome="HUNG",
                                                                         action="in_job_restart")
    assert _stand(tmp_path, Ledger(tmp_path / "ledger.json")) == 0
    assert "requeue 664" in slurm.read_text()


def test_a_fifo_planted_as_the_event_log_is_no_history_not_a_hang(slurm: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user planted a FIFO where the event log goes: the guard reads no history (runs_of) and decides on
    the job's evidence alone, without waiting for a writer; arming reads no earlier guard from it."""
    monkeypatch.setenv("FAKE_JOB_INFO", FAILED)
    os.mkfifo(tmp_path / "events.jsonl")
    assert armed(tmp_path / "events.jsonl", "664") == []
    assert _stand(tmp_path, Ledger(tmp_path / "ledger.json")) == 0
    assert "requeue 664" in slurm.read_text()


def test_the_guard_command_refuses_bad_values_with_the_rule() -> None:
    from slurmrt.cli import main

    assert main(["guard", "664", "--restart", "-1", "--batch-host", "n1"]) == 2
    assert main(["guard", "664", "--restart", "0", "--batch-host", "n1", "--nodes", "0"]) == 2


def test_the_guard_decides_with_what_the_newest_step_resolved_read_from_slurmrt_runs_directory(
        slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's script sets its checkpoint directory (so its event log) and max_restarts in code; the guard,
    started after the batch node died with `slurmrt run`, reads the newest well-formed record of the directory
    `slurmrt run` armed it with (the same record `slurmrt run` reads), not the environment's options."""
    import argparse

    from slurmrt.cli.guard import resolved
    from slurmrt.recovery import injob
    from slurmrt.recovery.facts import InJob

    monkeypatch.setenv("FAKE_SBATCH_ID", "901")
    run_dir = tmp_path / ".slurmrt-run-664"
    assert arm(Job("664"), "n1", events=EventLog(None, job="664", restart=0, rank=-1), output=None,
               run_dir=run_dir) == "901"
    (sbatch,) = [c.split() for c in slurm.read_text().splitlines() if c.startswith("sbatch")]
    assert sbatch[-2:] == ["--run-dir", str(run_dir)]
    record = {"event_log": tmp_path / "ckpt" / "events-664.jsonl", "checkpoint_dir": tmp_path / "ckpt",
              "requeue": True, "max_restarts": 2, "max_futile_runs": 3, "max_excluded_nodes": 4}
    injob.share_facts(InJob(run_dir, 0), record)
    injob.share_facts(InJob(run_dir, 1), {**record, "max_restarts": 7})
    args = argparse.Namespace(job="664", restart=0, nodes=3, run_dir=run_dir)
    env = {"SLURMRT_MAX_RESTARTS": "1"}
    facts, event_log = resolved(args, env)
    assert facts.policy.max_restarts == 7 and facts.job_nodes == 3  # the newest step's, not the environment's
    assert event_log(1).path == tmp_path / "ckpt" / "events-664.jsonl"
    injob.facts_path(run_dir, 1).write_text("{not json")  # a damaged newest record: the one before it
    assert resolved(args, env)[0].policy.max_restarts == 2
    for missing in (tmp_path / "gone", None):  # slurmrt run's directory gone, or a guard armed without it
        facts, event_log = resolved(argparse.Namespace(job="664", restart=0, nodes=3, run_dir=missing), env)
        assert facts.policy.max_restarts == 1 and event_log(0).path is None
