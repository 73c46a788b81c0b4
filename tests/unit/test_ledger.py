"""The bad-node ledger: nodes remembered across jobs, per user and per cluster (slurmrt.record.ledger)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from slurmrt.cli import main
from slurmrt.record import ledger as ledger_module
from slurmrt.record.events import EventLog
from slurmrt.record.ledger import Ledger, ledger_path
from slurmrt.recovery.executor import Executor
from slurmrt.recovery.facts import Facts
from slurmrt.recovery.plan import Action, Trigger
from slurmrt.recovery.settings import RecoverySection
from slurmrt.recovery.supervisor import place
from tests.unit.conftest import fake_slurm


def test_nodes_are_written_down_seen_again_and_forgotten_after_the_ttl(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "state" / "bad-nodes.json")
    now = [1_000_000.0]
    monkeypatch.setattr(ledger_module._clock, "wall", lambda: now[0])
    ledger.record(["n3", "n3", "n5"], reason="hang: no step for 600 s", job="7001")
    now[0] += 3600
    ledger.record(["n5"], reason="node_gone: n5 left the job", job="7002")
    entries = ledger.entries()
    assert entries["n3"].job == "7001" and entries["n3"].count == 1
    assert entries["n5"].count == 2 and entries["n5"].first == 1_000_000.0 and entries["n5"].job == "7002"
    assert ledger.nodes() == ["n5", "n3"]  # the most recently seen first
    now[0] += ledger_module.TTL_S - 1800  # n3 last seen 24.5 h ago, n5 23.5 h ago
    assert ledger.nodes() == ["n5"]
    assert ledger.clear() == ["n5"] and ledger.nodes() == []


def test_the_ledger_is_per_user_and_per_cluster_and_damage_costs_nothing(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert ledger_path(env, "east") == tmp_path / "slurmrt" / "bad-nodes-east.json"
    assert ledger_path(env, "west") != ledger_path(env, "east")
    assert ledger_path({**env, "SLURMRT_NODE_LEDGER": "/x/y.json"}, "east") == Path("/x/y.json")
    path = ledger_path(env, "east")
    path.parent.mkdir(parents=True)
    path.write_text('{"nodes": {"n1": {"reason": 5}, "n2": [], "n3": {"reason": "hang", "first": 1, "last": "x"}')
    ledger = Ledger(path)
    assert ledger.nodes() == [] and "cannot be read" in caplog.text
    ledger.record(["n4"], reason="unhealthy: CUDA", job="9")  # rewritten whole, the damage gone
    assert list(json.loads(path.read_text())["nodes"]) == ["n4"]
    os.unlink(path)
    os.mkfifo(path)  # planted: an error in a warning, never a wait
    assert ledger.nodes() == []


def test_two_jobs_recording_at_once_lose_neither_record(tmp_path: Path) -> None:
    path = tmp_path / "bad-nodes.json"
    threads = [threading.Thread(target=lambda i=i: Ledger(path).record([f"n{i}"], reason="hang", job=str(i)))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(Ledger(path).nodes()) == sorted(f"n{i}" for i in range(8))


def test_a_step_is_placed_away_from_ledger_nodes_which_stay_last_resort_spares() -> None:
    allocation = ["n1", "n2", "n3", "n4"]
    assert place(allocation, [], 3, avoid=["n2"]) == place(["n1", "n3", "n4", "n2"], [], 3)
    placement = place(allocation, ["n4"], 3, avoid=["n2"])
    assert placement is not None and placement.nodes == ("n1", "n3", "n2") and placement.spares == ()


def test_recovery_writes_the_nodes_it_leaves_out_and_the_requeue_excludes_the_ledgers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_slurm(monkeypatch, tmp_path / 'bin')}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "calls"))
    ledger = Ledger(tmp_path / "bad-nodes.json")
    ledger.record(["n9"], reason="hang: an earlier job", job="6000")
    events = EventLog(tmp_path / "events.jsonl", job="7001", restart=0, rank=0)
    executor = Executor(Facts(job="7001", policy=RecoverySection(max_excluded_nodes=4)), events, node="n1",
                        requeue_job=lambda job: (True, f"job {job} requeued"), ledger=ledger)
    decision = executor.recover(Trigger.HANG, nodes=["n5"], detail="no step for 600 s")
    assert decision.action is Action.REQUEUE and "ExcNodeList=n5,n9" in (tmp_path / "calls").read_text()
    assert "n5" not in ledger.entries(), "a hang's suspect is no evidence against its node: this job only"
    decision = executor.recover(Trigger.UNHEALTHY, nodes=["n2"], detail="/dev/shm is not writable")
    assert decision.action is Action.REQUEUE
    assert ledger.entries()["n2"].reason == "unhealthy: /dev/shm is not writable"
    assert ledger.entries()["n2"].job == "7001"
    calls = (tmp_path / "calls").read_text()
    assert "ExcNodeList=n2,n9" in calls, calls  # this run's node first, then the ledger's
    executor.recover(Trigger.STRAGGLER, nodes=["n7"])
    assert "n7" not in ledger.entries(), "a straggler is slow, not broken"


def test_slurmrt_nodes_lists_prints_the_sbatch_option_and_clears(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    ledger = Ledger(Path(os.environ["SLURMRT_NODE_LEDGER"]))
    assert main(["nodes", "--cluster", "c1"]) == 0
    assert "no bad nodes remembered for cluster c1" in capsys.readouterr().out
    assert main(["nodes", "--cluster", "c1", "--sbatch"]) == 0 and capsys.readouterr().out == ""
    ledger.record(["gpu017", "gpu018", "gpu003"], reason="node_gone: left the job", job="4242")
    assert main(["nodes", "--cluster", "c1"]) == 0
    out = capsys.readouterr().out
    assert "gpu017: node_gone: left the job (job 4242" in out and "--exclude=gpu[003,017-018]" in out
    assert main(["nodes", "--cluster", "c1", "--sbatch"]) == 0
    assert capsys.readouterr().out == "--exclude=gpu[003,017-018]\n"
    assert main(["nodes", "--cluster", "c1", "--clear", "gpu[017-018]"]) == 0
    assert "forgot gpu[017-018]" in capsys.readouterr().out and ledger.nodes() == ["gpu003"]


def test_slurmrt_nodes_never_excludes_a_job_out_of_its_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger that names every node of a 4-node partition (processes killed on each, before it believed evidence
    only): --sbatch leaves out at most half the partition, and never so many that the job's nodes do not fit; it
    says on stderr which nodes it kept in."""
    monkeypatch.setattr("slurmrt.cli.nodes.partition_nodes", lambda partition: {"gpu": 4}.get(partition))
    ledger = Ledger(Path(os.environ["SLURMRT_NODE_LEDGER"]))
    for node in ("n1", "n2", "n3", "n4"):  # n4 the most recently seen
        ledger.record([node], reason="node_gone: left the job", job="1")
    assert main(["nodes", "--cluster", "c1", "--sbatch", "--partition", "gpu", "--nodes", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == "--exclude=n4\n" and "not excluded: n[1-3]" in err and "the job needs 3" in err
    assert main(["nodes", "--cluster", "c1", "--sbatch", "--partition", "gpu"]) == 0
    out, err = capsys.readouterr()
    assert out in ("--exclude=n[3-4]\n",) and "not excluded: n[1-2]" in err
    assert main(["nodes", "--cluster", "c1", "--sbatch", "--max", "1"]) == 0  # no partition: --max alone
    assert capsys.readouterr().out == "--exclude=n4\n"
    with pytest.raises(SystemExit):
        main(["nodes", "--sbatch", "--max", "0"])
