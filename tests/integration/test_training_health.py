"""The training's health (``rt.check``) with real processes and gloo, in the in-process restart's worker: a NaN on
one rank stops every rank at that step before its update; once (transient) the step is re-run in the same processes,
passes, and the rank's node is left out (a requeue without it), and the requeued run ends bitwise where an
uninterrupted run does; at the same step again (reproducible) it is rewound to the newest certified checkpoint with
the batches since skipped, and ends bitwise where an uninterrupted run that skipped them does; with no certified
checkpoint, or no rewind left, it ends and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_inprocess import N, _events, _logs, _run  # the same worker, run the same way

pytestmark = pytest.mark.timeout(240)


def test_a_nan_on_one_rank_is_re_run_then_its_node_is_left_out_and_the_run_ends_bitwise_equal(tmp_path: Path) -> None:
    import torch

    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean) == [0] * N, _logs(clean)
    # Run 0: the NaN at step 7 is re-run in the process; the step passes, so the fault was transient, and its rank's
    # node is left out: every rank stops at the next agreed step, saves, and the job is requeued without it.
    unhealthy = 6  # Outcome.UNHEALTHY, as for a node that failed its health check
    ledger = {"SLURMRT_NODE_LEDGER": str(faulted / "bad-nodes.json")}
    assert _run(faulted, "--nan", "0:1:7", env=ledger) == [unhealthy] * N, _logs(faulted)
    (health,) = _events(faulted, "training_health")
    assert (health["step"], health["what"], health["first_rank"], health["suspects"]) == \
        (7, "nonfinite", 1, ["localhost"])
    (restart,) = _events(faulted, "in_process")
    assert restart["action"] == "restart" and "TrainingHealthError" in restart["error"]
    (transient,) = _events(faulted, "transient_fault")
    assert (transient["step"], transient["nodes"], transient["left_out"]) == (7, ["localhost"], True)
    (stop,) = [e for e in _events(faulted, "exit") if e["rank"] == 0]
    assert (stop["action"], stop["exclude"], stop["reasons"]) == ("requeue", ["localhost"], ["suspect"]), stop
    calls = (faulted / "slurm-calls.log").read_text()
    assert "requeue 4242" in calls and "ExcNodeList=localhost" in calls, calls
    generations = json.loads((faulted / "out" / "generations.json").read_text())
    assert [g["resumed"] for g in generations] == [None, 6]  # re-run from the local tier's newest, before step 7
    said = (faulted / "rank1.log").read_text()
    assert "WARNING slurmrt: rank 1, step 7: loss is nan" in said and " ERROR " not in said, said  # answered: no error
    ledger_entry = json.loads((faulted / "bad-nodes.json").read_text())["nodes"]["localhost"]
    assert "a transient fault" in ledger_entry["reason"] and ledger_entry["job"] == "4242"
    # Run 1, the requeued job (on other nodes; here the same processes' host): it resumes and ends.
    assert _run(faulted, env={"SLURM_RESTART_COUNT": "1"}) == [0] * N, _logs(faulted)
    a, b = torch.load(clean / "out" / "weights.pt"), torch.load(faulted / "out" / "weights.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the NaN never reached the weights


def test_a_nan_that_comes_back_with_no_certified_checkpoint_ends_the_run_on_every_rank(tmp_path: Path) -> None:
    codes = _run(tmp_path, "--nan", "*:1:7")
    assert len(set(codes)) == 1 and codes[0] != 0, _logs(tmp_path)
    assert [(e["step"], e["first_rank"]) for e in _events(tmp_path, "training_health")] == [(7, 1), (7, 1)]
    made, refused = _events(tmp_path, "in_process")
    assert made["action"] == "restart" and refused["action"] == "refused" and "nothing to rewind to" in refused["why"]
    assert not (tmp_path / "out" / "weights.pt").exists()


def test_a_nan_that_comes_back_rewinds_to_the_certified_checkpoint_and_skips_the_batches_since(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from slurmrt.cli import main

    certify = {"SLURMRT_HEALTH_CERTIFY_AFTER": "3"}
    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean, "--skip", "1-7", env=certify) == [0] * N, _logs(clean)
    assert _run(faulted, "--nan", "*:1:7", env=certify) == [0] * N, _logs(faulted)
    health = _events(faulted, "training_health")
    assert [(e["step"], e["action"], e["certified"]) for e in health] == [(7, "rerun", None), (7, "rewind", 0)]
    generations = json.loads((faulted / "out" / "generations.json").read_text())
    assert [g["resumed"] for g in generations] == [None, 6, 0]  # re-run from the newest, then the certified one
    # Step 5 was saved but not certified (healthy only through step 6): set aside, never loaded again.
    assert [p.name.split("-")[1] for p in (faulted / "ckpt").glob(".tainted-step_*")] == ["step_000000005"]
    record = json.loads((faulted / "ckpt" / "health.json").read_text())
    assert record["skips"] == [[1, 7]] and record["rewinds"] == {"0": 1} and record["faults"] == {"7": 2}
    assert record["certified"] == 25 and (faulted / "ckpt" / "step_000000025").is_dir()
    a, b = torch.load(clean / "out" / "weights.pt"), torch.load(faulted / "out" / "weights.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # as if those batches were never there
    assert main(["status", str(faulted / "ckpt"), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["certified"][0] == 0 and job["certified"][-1] == 25
    saved = [c for run in job["runs"] for c in run["checkpoints"]]
    assert {c["step"]: c["certified"] for c in saved}[25] is True and {c["step"] for c in saved if c["certified"]} \
        == set(job["certified"])
    assert job["goodput"]["seconds"]["health_rerun"] > 0 and job["goodput"]["seconds"]["health_rewind"] > 0
    assert job["runs"][0]["in_process_cost"]["skipped_steps"] == 7
    assert main(["status", str(faulted / "ckpt"), "--no-chart"]) == 0
    assert "certified checkpoint(s): step 0, " in capsys.readouterr().out


def test_a_fault_that_comes_back_with_no_rewind_left_ends_naming_the_checkpoint_to_start_from(tmp_path: Path) -> None:
    env = {"SLURMRT_HEALTH_CERTIFY_AFTER": "3", "SLURMRT_HEALTH_MAX_REWINDS": "0"}
    codes = _run(tmp_path, "--nan", "*:1:7", env=env)
    assert len(set(codes)) == 1 and codes[0] != 0, _logs(tmp_path)
    made, refused = _events(tmp_path, "in_process")
    assert made["action"] == "restart" and refused["action"] == "refused"
    assert "start again from checkpoint step_000000000" in refused["why"], refused
    assert not (tmp_path / "ckpt" / "step_000000005").exists()  # the run that starts again resumes from step 0
    assert (tmp_path / "ckpt" / "step_000000000").is_dir()


def test_a_flipped_bit_is_found_by_the_replica_hash_within_k_steps_and_re_run_from_where_the_replicas_agreed(
        tmp_path: Path) -> None:
    import torch

    every = {"SLURMRT_HEALTH_HASH_EVERY": "4"}
    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean, "--replicas", env=every) == [0] * N, _logs(clean)
    # Rank 1's copy alone differs, and the re-run passes: the fault was transient and rank 1's node is left out (the
    # job requeued without it); the requeued run resumes where the re-run stopped.
    assert _run(faulted, "--replicas", "--flip", "0:1:9", env=every) == [6] * N, _logs(faulted)
    (health,) = _events(faulted, "training_health")
    assert (health["step"], health["what"], health["first_rank"], health["action"], health["suspects"]) == \
        (12, "replicas", 1, "rerun", ["localhost"])
    assert [e["step"] for e in _events(faulted, "transient_fault")] == [12]
    assert "rank 1, step 12: its replicas' hash differs" in (faulted / "rank1.log").read_text()
    generations = json.loads((faulted / "out" / "generations.json").read_text())
    # The replicas last agreed at step 8: step 10's checkpoint may hold the flipped bit, set aside; step 5 loaded.
    assert [g["resumed"] for g in generations] == [None, 5]
    assert [p.name.split("-")[1] for p in (faulted / "ckpt").glob(".tainted-step_*")] == ["step_000000010"]
    assert _run(faulted, "--replicas", env={**every, "SLURM_RESTART_COUNT": "1"}) == [0] * N, _logs(faulted)
    a, b = torch.load(clean / "out" / "weights.pt"), torch.load(faulted / "out" / "weights.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the flip never reached the result


def test_a_spike_a_batch_causes_is_rewound_and_skipped_as_slurmrt_sim_rehearses_it(tmp_path: Path) -> None:
    import torch

    certify = {"SLURMRT_HEALTH_CERTIFY_AFTER": "3"}
    clean, faulted = tmp_path / "clean", tmp_path / "faulted"
    assert _run(clean, "--skip", "21-25", env=certify) == [0] * N, _logs(clean)
    # What `slurmrt sim --spike TASK:STEP` sets: that loss spikes every time the process reaches the step.
    assert _run(faulted, env={**certify, "SLURMRT_SIM_SPIKE": "25"}) == [0] * N, _logs(faulted)
    health = _events(faulted, "training_health")
    assert [(e["step"], e["what"], e["action"], e["certified"]) for e in health] == [
        (25, "spike", "rerun", None), (25, "spike", "rewind", 20)]
    a, b = torch.load(clean / "out" / "weights.pt"), torch.load(faulted / "out" / "weights.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


AGREE = """
import json
import torch.distributed as dist
import slurmrt

rt = slurmrt.init(deadline=False)  # with the watchdog's census: it names a rank's node
dist.init_process_group("gloo")
rt.should_stop(0)  # slurmrt's groups open, each rank's node in the census
said = {"means": [rt.check(step, loss=float(rt.rank + step)) for step in range(3)],
        "no_loss": rt.check(3, grad_norm=1.0)}
def broken(rank):
    raise RuntimeError("the store does not answer")


for step, bad in ((4, (2,)), (5, (1, 3)), (6, (2,))):  # one rank alone, then two: the lowest is named, no suspect
    if step == 6 and rt.rank == 0:  # rank 0's census fails: the others' answer names the node on every rank
        rt.parts.health._node_of = broken
    try:
        rt.check(step, loss=float("nan") if rt.rank in bad else 1.0)
    except slurmrt.TrainingHealthError as err:
        said[str(step)] = [err.details["rank"], err.details["what"], rt.parts.health.record.suspects.get(step)]
print("SAID " + json.dumps(said), flush=True)
rt.close()
dist.destroy_process_group()
"""


def test_the_agreement_returns_the_ranks_mean_loss_and_names_the_lowest_unhealthy_rank(tmp_path: Path) -> None:
    from .launch import start, wait_all

    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    assert wait_all(start(4, tmp_path, [], script=script), timeout=120) == [0] * 4, _logs(tmp_path)
    for rank in range(4):
        (line,) = [ln for ln in (tmp_path / f"rank{rank}.log").read_text().splitlines() if ln.startswith("SAID ")]
        said = json.loads(line[5:])
        assert said["means"] == [1.5, 2.5, 3.5] and said["no_loss"] is None, said  # (0+1+2+3)/4 + step
        assert said["4"][:2] == [2, "nonfinite"] and said["5"] == [1, "nonfinite", []], said
        assert said["4"][2] == ["localhost"], said  # rank 2 alone: its node is the suspect
        assert said["6"] == [2, "nonfinite", ["localhost"]], said
