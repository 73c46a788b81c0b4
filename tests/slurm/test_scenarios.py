"""Each scenario is a real sbatch job running the test worker (slurmrt + gloo) on the local Slurm cluster.

What is asserted: the checkpoint's step and contents, the event log, the step each run resumed from, that no step
after the last checkpoint was trained twice or skipped, and the final weights against an uninterrupted run.
"""

from __future__ import annotations

import calendar
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import expected_weights

from .conftest import ROOT, WORKER, Job, slurm, submit, wait_for_file

pytestmark = pytest.mark.timeout(900)


def runs(directory: Path, world: int) -> list[list[dict[str, Any]]]:
    """The worker results of each run of the job (run0, run1, ...), rank by rank."""
    out = []
    k = 0
    while (directory / f"run{k}").exists():
        ranks = [directory / f"run{k}" / f"rank{r}.json" for r in range(world)]
        out.append([json.loads(p.read_text()) for p in ranks if p.exists()])
        k += 1
    return out


def events(directory: Path, job: Job) -> list[dict[str, Any]]:
    path = directory / "ckpt" / f"events-{job.id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_trained_exactly_once(all_runs: list[list[dict[str, Any]]], steps: int, world: int) -> None:
    """Every run resumed right after the step its predecessor checkpointed; the last one reached the end."""
    expected_start = 0
    for k, ranks in enumerate(all_runs):
        assert len(ranks) == world, f"run {k}: {len(ranks)} of {world} ranks reported"
        assert len({r["stopped_at"] for r in ranks}) == 1, f"run {k}: ranks stopped at different steps"
        assert all(r["start"] == expected_start for r in ranks), (k, [r["start"] for r in ranks], expected_start)
        last = ranks[0]["stopped_at"] if ranks[0]["stopped_at"] is not None else steps - 1
        assert all(r["trained"] == list(range(expected_start, last + 1)) for r in ranks)
        assert all(r["saved"] for r in ranks), f"run {k} stopped without a checkpoint"
        expected_start = last + 1
    assert expected_start == steps, f"the runs trained up to {expected_start}, planned {steps}"
    assert all_runs[-1][0]["w"] == pytest.approx(expected_weights(steps, world), abs=1e-5)


@pytest.fixture(scope="module")
def long_jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Job, Path, int]]:
    """The scenarios that drive themselves, submitted together so that they run side by side."""
    jobs: dict[str, tuple[Job, Path, int]] = {}
    d = tmp_path_factory.mktemp("timelimit")
    steps = 120
    jobs["timelimit"] = (submit(
        d, f'srun $PY $WORKER --out $OUT --steps {steps} --step-time 0.4',
        "-N2", "--ntasks-per-node=1", "--time=1", "--requeue", name="timelimit",
        exports={"SLURMRT_DEADLINE_MARGIN_S": "8", "SLURMRT_SAVE_TIME_S": "3"}), d, steps)
    steps = 200
    d = tmp_path_factory.mktemp("signal_steps")
    jobs["signal_steps"] = (submit(
        d, f'srun $PY $WORKER --out $OUT --steps {steps} --step-time 0.5',
        "-N2", "--ntasks-per-node=1", "--time=2", "--signal=USR1@30", "--requeue", name="signal_steps",
        exports={"SLURMRT_DEADLINE": "0"}), d, steps)
    d = tmp_path_factory.mktemp("signal_batch")
    # The forwarding pattern of docs/quickstart.md, for --signal=B:USR1: the batch shell passes it to srun.
    body = "\n".join([
        "trap 'echo forwarding USR1; kill -USR1 \"$SRUN_PID\"' USR1",
        f"srun $PY $WORKER --out $OUT --steps {steps} --step-time 0.5 &",
        "SRUN_PID=$!",
        'wait "$SRUN_PID"',
        'wait "$SRUN_PID"',
    ])
    jobs["signal_batch"] = (submit(
        d, body, "-N2", "--ntasks-per-node=1", "--time=2", "--signal=B:USR1@30", "--requeue", name="signal_batch",
        exports={"SLURMRT_DEADLINE": "0"}), d, steps)
    d = tmp_path_factory.mktemp("fidelity_real")
    jobs["fidelity"] = (submit(d, FIDELITY_BODY, "-N2", "--ntasks-per-node=2", "--time=2", "--signal=USR1@30",
                               "--requeue", name="fidelity", exports={"SLURMRT_DEADLINE": "0"}), d, 0)
    return jobs


# The same job for the real cluster and for `slurmrt sim`: stopped by its --signal, requeued, resumed once.
FIDELITY_BODY = "srun $PY $WORKER --out $OUT --steps 100000 --step-time 0.1 --resume-steps 10"


def test_1_two_nodes_two_tasks_topology_and_all_reduce_across_nodes(cluster: Path, tmp_path: Path) -> None:
    job = submit(tmp_path, "srun $PY $WORKER --out $OUT --steps 5 --step-time 0", "-N2", "--ntasks-per-node=2",
                 name="topology")
    info = job.wait(300)
    assert info["JobState"] == "COMPLETED", job.output()
    (ranks,) = runs(tmp_path, 4)
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["hostname"]) for r in ranks] == [
        (0, 0, 0, "n1"), (1, 1, 0, "n1"), (2, 0, 1, "n2"), (3, 1, 1, "n2")]
    assert {(r["world_size"], r["local_world_size"], r["nnodes"]) for r in ranks} == {(4, 2, 2)}
    assert {r["master_addr"] for r in ranks} == {r["env_master_addr"] for r in ranks} == {"n1"}
    assert len({r["master_port"] for r in ranks}) == 1
    # The cluster numbers its jobs from 100, afresh at each start (cluster.sh): its ports stay clear of the fake ids
    # of the integration tests and of simulated jobs, which run beside it (tests/run.sh).
    assert 100 <= int(job.id) < 1384, f"job id {job.id}: restart the test cluster (cluster.sh stop, then start)"
    assert ranks[0]["w"] == pytest.approx(expected_weights(5, 4), abs=1e-5)  # gradients all_reduced over 2 nodes


def test_5_scancel_stops_cleanly_saves_within_killwait_and_is_not_requeued(cluster: Path, tmp_path: Path) -> None:
    # Periodic saves measure the save time, so the stop knows a save fits in KillWait (told: 10 s).
    job = submit(tmp_path, "srun $PY $WORKER --out $OUT --steps 100000 --step-time 0.2 --save-every 5",
                 "-N2", "--ntasks-per-node=1", "--requeue", name="scancel", exports={"SLURMRT_KILL_WAIT_S": "10"})
    wait_for_file(tmp_path / "ckpt" / "latest", 300, job)
    time.sleep(1)
    slurm("scancel", job.id)
    info = job.wait(120)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0"
    (ranks,) = runs(tmp_path, 2)
    assert all(r["reasons"] == ["sigterm"] and r["saved"] and r["exit_code"] == 4 for r in ranks)
    stop = ranks[0]["stopped_at"]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step_{stop:09d}"
    ev = events(tmp_path, job)
    assert [e["outcome"] for e in ev if e["event"] == "exit"] == ["STOPPED"]
    assert not [e for e in ev if e["event"] == "requeue"]


def test_6_kill_switch_during_an_array_drains_every_task_without_requeue(cluster: Path, tmp_path: Path) -> None:
    switch = tmp_path / "STOP"
    body = ("export SLURMRT_CHECKPOINT_DIR=$SLURMRT_CHECKPOINT_DIR-$SLURM_ARRAY_TASK_ID\n"
            "srun $PY $WORKER --out $OUT-task$SLURM_ARRAY_TASK_ID --steps 100000 --step-time 0.2 "
            "--ready $OUT-task$SLURM_ARRAY_TASK_ID.ready")
    job = submit(tmp_path, body, "--array=1-4%1", "-N1", "--ntasks-per-node=2", "--requeue", name="array",
                 exports={"SLURMRT_KILL_SWITCH": str(switch), "SLURMRT_WATCH_INTERVAL_S": "1"})
    wait_for_file(tmp_path / "run0-task1.ready", 300, job)
    switch.touch()
    infos = job.wait_all(300)
    assert len(infos) == 4
    assert {(i["JobState"], i["ExitCode"], i["Restarts"]) for i in infos} == {("COMPLETED", "0:0", "0")}
    first = [json.loads((tmp_path / "run0-task1" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["reasons"] == ["kill_switch"] and r["saved"] and r["exit_code"] == 0 for r in first)
    for task in (2, 3, 4):
        assert not list((tmp_path / f"run0-task{task}").glob("rank*.json")), f"task {task} ran despite the switch"
        (info,) = [i for i in infos if i.get("ArrayTaskId") == str(task)]
        took = _seconds(info["EndTime"]) - _seconds(info["StartTime"])
        assert took <= 30, f"task {task} took {took} s to drain"


def _event_time(event: dict[str, Any]) -> float:
    """An event's ISO time (UTC) as epoch seconds."""
    return calendar.timegm(time.strptime(event["time"][:19], "%Y-%m-%dT%H:%M:%S"))


def _seconds(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_7_nnodes_mismatch_fails_every_rank_within_seconds(cluster: Path, tmp_path: Path) -> None:
    job = submit(tmp_path, "srun $PY $WORKER --out $OUT --steps 10; exit $?", "-N2", "--ntasks-per-node=1",
                 name="nnodes", exports={"NNODES": "4"})
    info = job.wait(300)
    assert info["JobState"] == "FAILED"
    assert _seconds(info["EndTime"]) - _seconds(info["StartTime"]) <= 300  # a rendezvous would wait 30 minutes
    assert job.output().count("slurmrt: NodeCountError: NNODES=4 but this step runs on 2 nodes") == 2  # each node
    assert "Traceback" not in job.output() and info["ExitCode"] == "78:0"  # ExitCode.CONFIG: nothing requeues it


def test_7_early_interpolated_slurm_procid_fails_within_seconds(cluster: Path, tmp_path: Path) -> None:
    # The batch shell expands $SLURM_PROCID (0) once for every task: each one claims to be rank 0.
    # Each task's stderr goes to its own file: srun, ending the step, may drop the last lines it still forwards.
    job = submit(tmp_path, "export RANK=$SLURM_PROCID WORLD_SIZE=2 LOCAL_RANK=0\n"
                           "srun --kill-on-bad-exit=1 --error=$OUT-%t.err $PY $WORKER --out $OUT --steps 10; exit $?",
                 "-N2", "--ntasks-per-node=1", name="early_rank")
    info = job.wait(300)
    assert info["JobState"] == "FAILED"
    assert _seconds(info["EndTime"]) - _seconds(info["StartTime"]) <= 300  # a rendezvous would wait 30 minutes
    assert "LauncherConflictError: RANK=0 contradicts SLURM_PROCID=1" in (tmp_path / "run0-1.err").read_text()


def test_7_early_interpolated_node_rank_under_torchrun_fails_within_seconds(cluster: Path, tmp_path: Path) -> None:
    # `torchrun --node_rank $SLURM_PROCID` written in the batch script: every node's agent claims node 0. On a real
    # cluster the workers on the second node start and slurmrt raises NodeRankError there; on this one-host cluster
    # the second agent already fails to bind the store port. Either way: seconds, not a rendezvous timeout.
    body = ("srun --kill-on-bad-exit=1 $PY -m torch.distributed.run --nnodes 2 --nproc-per-node 1 "
            "--node_rank $SLURM_PROCID --master_addr n1 --master_port $((20000 + SLURM_JOB_ID % 10000)) "
            "$WORKER --out $OUT --steps 10; exit $?")
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=1", name="early_node_rank")
    info = job.wait(300)
    assert info["JobState"] == "FAILED"
    assert _seconds(info["EndTime"]) - _seconds(info["StartTime"]) <= 300  # a rendezvous would wait 30 minutes
    assert not (tmp_path / "run0").exists() or not list((tmp_path / "run0").glob("rank*.json"))


@pytest.mark.parametrize("gate", ["slurmrt run", "doctor --launch"])
def test_7_a_launcher_per_node_given_more_nodes_than_the_job_has_fails_before_it_starts(cluster: Path, tmp_path: Path,
                                                                                        gate: str) -> None:
    """The guides' cautionary case: `torchrun --nnodes 3` in a 2-node job never starts its workers (no init() check
    runs) and waited in its rendezvous, saying nothing. `slurmrt run` and the batch script's gate read the
    launcher's node count first and fail in seconds with one line; no worker ever starts."""
    launch = ("bash -c '$PY -m torch.distributed.run --nnodes \"$NODES\" --nproc-per-node 1 --node-rank "
              "\"$SLURM_NODEID\" --master-addr n1 --master-port $((20000 + SLURM_JOB_ID % 10000)) $WORKER --out $OUT "
              "--steps 10'")
    body = f"exec $PY -m slurmrt run -- {launch}" if gate == "slurmrt run" else \
        f"$PY -m slurmrt doctor --launch -- {launch} || exit $?\nsrun {launch}"
    job = submit(tmp_path, f"export NODES=3 PY WORKER OUT\n{body}", "-N2", "--ntasks-per-node=1",
                 name="launcher_nodes")
    info = job.wait(300)
    out = job.output()
    assert info["JobState"] == "FAILED", out[-3000:]
    assert _seconds(info["EndTime"]) - _seconds(info["StartTime"]) <= 60, out[-3000:]  # a rendezvous: 30 minutes
    (said,) = [line for line in out.splitlines() if "torchrun --nnodes $NODES (= 3)" in line]
    assert "2 node(s)" in said and "Fix:" in said, said
    assert not (tmp_path / "run0").exists(), "a worker started"


def test_8_a_killed_task_ends_the_job_which_requeues_and_resumes_from_the_last_checkpoint(
        cluster: Path, tmp_path: Path) -> None:
    steps = 150
    body = "\n".join([
        f"srun --kill-on-bad-exit=1 $PY $WORKER --out $OUT --steps {steps} --step-time 0.2 --save-every 10 "
        "--pid-dir $OUT.pids",
        "rc=$?",
        'echo "srun exited $rc"',
        # The pattern of docs/reference/exit-codes.md: a task died (node failure, OOM, SIGKILL) -> requeue, resume.
        'case $rc in 0|3|4) ;; *) [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ] && scontrol requeue "$SLURM_JOB_ID" ;; esac',
    ])
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=1", "--requeue", name="nodefail")
    wait_for_file(tmp_path / "ckpt" / "latest", 300, job)
    wait_for_file(tmp_path / "run0.pids" / "1.pid", 60, job)
    time.sleep(1.5)
    committed_before_kill = int((tmp_path / "ckpt" / "latest").read_text().split("_")[1])
    os.kill(int((tmp_path / "run0.pids" / "1.pid").read_text()), signal.SIGKILL)
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    assert not list((tmp_path / "run0").glob("rank*.json")), "run 0 was killed: no rank finished it"
    later = runs(tmp_path, 2)[1:]
    resumed_after = later[0][0]["start"] - 1
    saved_in_run0 = {e["step"] for e in events(tmp_path, job) if e["event"] == "save" and e["restart"] == 0}
    assert resumed_after in saved_in_run0 and resumed_after >= committed_before_kill
    assert_trained_exactly_once_from(later, resumed_after + 1, steps, 2)


def assert_trained_exactly_once_from(all_runs: list[list[dict[str, Any]]], first: int, steps: int,
                                     world: int) -> None:
    expected_start = first
    for ranks in all_runs:
        assert all(r["start"] == expected_start for r in ranks)
        last = ranks[0]["stopped_at"] if ranks[0]["stopped_at"] is not None else steps - 1
        assert all(r["trained"] == list(range(expected_start, last + 1)) for r in ranks)
        expected_start = last + 1
    assert expected_start == steps
    assert all_runs[-1][0]["w"] == pytest.approx(expected_weights(steps, world), abs=1e-5)


def test_2_time_limit_without_signal_saves_before_sigterm_requeues_and_finishes(
        long_jobs: dict[str, tuple[Job, Path, int]]) -> None:
    job, d, steps = long_jobs["timelimit"]
    info = job.wait(800)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    all_runs = runs(d, 2)
    assert_trained_exactly_once(all_runs, steps, 2)
    assert all(r["reasons"] == ["deadline"] and r["exit_code"] in (3, None) for ranks in all_runs[:-1] for r in ranks)
    ev = events(d, job)
    first_run = [e for e in ev if e["restart"] == 0]
    assert not [e for e in first_run if e["event"] == "signal"], "Slurm's SIGTERM came before the deadline save"
    (decision,) = [e for e in first_run if e["event"] == "decision"]
    saves = [e for e in first_run if e["event"] == "save"]
    assert saves and _event_time(saves[-1]) < decision["end_time"], "the checkpoint must land before the end time"
    assert [e["done"] for e in ev if e["event"] == "requeue"][:1] == [True]


@pytest.mark.parametrize("name", ["signal_steps", "signal_batch"])
def test_3_signal_warning_stops_saves_requeues_and_resumes(long_jobs: dict[str, tuple[Job, Path, int]],
                                                           name: str) -> None:
    job, d, steps = long_jobs[name]
    info = job.wait(800)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    all_runs = runs(d, 2)
    assert_trained_exactly_once(all_runs, steps, 2)
    assert all(r["reasons"] == ["signal"] and r["exit_code"] in (3, None) for ranks in all_runs[:-1] for r in ranks)
    exits = [e for e in events(d, job) if e["event"] == "exit"]
    assert [e["outcome"] for e in exits] == ["REQUEUED"] * (len(all_runs) - 1) + ["FINISHED"]
    if name == "signal_batch":
        assert "forwarding USR1" in job.output()


# Set by Slurm or the sim per job or per process, or inherited from the submitting shell: never comparable.
_UNCOMPARABLE = {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_TASK_PID", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT",
                 "SLURM_WORKING_CLUSTER", "SLURM_CLUSTER_NAME", "SLURM_JOB_NAME", "SLURM_JOB_PARTITION",
                 "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_CONF"}


def _event_sequence(path: Path) -> list[tuple[Any, ...]]:
    seq: list[tuple[Any, ...]] = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "progress":
            continue  # a sample every SLURMRT_PROGRESS_S: how many depends on how long the run took
        detail = e.get("reasons") if e["event"] in {"decision", "exit"} else e.get("signal")
        detail = e.get("outcome", detail) if e["event"] == "exit" else detail
        seq.append((e["restart"], e["rank"], e["event"], str(detail)))
    return sorted(seq)  # ranks write concurrently; the order between ranks is not part of the behaviour


def test_5_sim_matches_the_real_cluster_environment_and_event_sequence(
        long_jobs: dict[str, tuple[Job, Path, int]], tmp_path: Path) -> None:
    job, real_dir, _ = long_jobs["fidelity"]
    info = job.wait(800)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", job.output()[-3000:]
    sim_dir = tmp_path / "sim"
    sim_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "SLURMRT_DEADLINE": "0",
                "SLURMRT_CHECKPOINT_DIR": str(sim_dir / "ckpt"), "SLURMRT_EVENT_LOG": str(sim_dir / "events.jsonl")})
    body = FIDELITY_BODY.replace("$PY", sys.executable).replace("$WORKER", str(WORKER))
    body = body.replace("$OUT", f"{sim_dir}/run${{SLURM_RESTART_COUNT:-0}}")
    script = sim_dir / "fidelity.sbatch"
    # The signal comes 40 s after the start: time for 4 tasks to import torch on a loaded 2-core machine.
    directives = "-N2 --ntasks-per-node=2 --time=1:00 --signal=USR1@20 --requeue --open-mode=append"
    script.write_text(f"#!/bin/bash\n#SBATCH {directives}\n{body}\n")
    out = subprocess.run([sys.executable, "-m", "slurmrt", "sim", str(script)], cwd=sim_dir, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    real_runs, sim_runs = runs(real_dir, 4), runs(sim_dir, 4)
    assert len(real_runs) == len(sim_runs) == 2
    for real_ranks, sim_ranks in zip(real_runs, sim_runs, strict=True):
        for real, simulated in zip(real_ranks, sim_ranks, strict=True):
            r_env = {k: v for k, v in real["env"].items() if k not in _UNCOMPARABLE}
            s_env = {k: v for k, v in simulated["env"].items() if k not in _UNCOMPARABLE}
            assert sorted(r_env) == sorted(s_env), set(r_env) ^ set(s_env)
            assert r_env == s_env
            assert real["reasons"] == simulated["reasons"]  # exit codes: a requeue may end a task before it says
    real_events = _event_sequence(real_dir / "ckpt" / f"events-{job.id}.jsonl")
    assert real_events == _event_sequence(sim_dir / "events.jsonl")


def test_4_preemption_uses_the_grace_time_to_save_and_resumes(cluster: Path, tmp_path: Path) -> None:
    steps = 150
    job = submit(tmp_path, f"srun $PY $WORKER --out $OUT --steps {steps} --step-time 0.2 --ready $OUT.ready",
                 "-p", "low", "--exclusive", "-N2", "-w", "n3,n4", "--ntasks-per-node=1", "--requeue",
                 "--signal=USR1@10", name="preempted")
    wait_for_file(tmp_path / "run0.ready", 600, job)
    time.sleep(1)
    preempted_at = time.time()
    high = submit(tmp_path / "high", "sleep 5", "-p", "high", "--exclusive", "-N2", "-w", "n3,n4", name="high")
    info = job.wait(600)
    assert high.wait(300)["JobState"] == "COMPLETED"
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    all_runs = runs(tmp_path, 2)
    assert_trained_exactly_once(all_runs, steps, 2)
    assert all(r["reasons"] == ["signal"] for r in all_runs[0])
    first_saves = [e for e in events(tmp_path, job) if e["event"] == "save" and e["restart"] == 0]
    assert _event_time(first_saves[-1]) - preempted_at < 20, "the save must land within the GraceTime (20 s)"


# -- launch shapes copied from the guides -------------------------------------------------------------------------

def test_9_pyxis_exports_and_hand_written_exports_keep_slurms_node_layout(cluster: Path, tmp_path: Path) -> None:
    # Pyxis's PyTorch hook exports RANK, WORLD_SIZE and LOCAL_RANK in every task; scripts often export RANK and
    # WORLD_SIZE alone. Both inside the step (escaped), with NNODES=2: the node layout must still be Slurm's.
    body = "\n".join([
        "export NNODES=2 PY WORKER OUT",
        "srun --kill-on-bad-exit=1 bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS "
        "LOCAL_RANK=$SLURM_LOCALID; exec $PY $WORKER --out $OUT-pyxis --steps 5 --step-time 0' || exit 1",
        "srun --kill-on-bad-exit=1 bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS; "
        "exec $PY $WORKER --out $OUT-hand --steps 5 --step-time 0'",
    ])
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=2", name="pyxis",
                 exports={"SLURMRT_CHECKPOINT_DIR": ""})
    info = job.wait(300)
    assert info["JobState"] == "COMPLETED", job.output()[-3000:]
    for shape in ("pyxis", "hand"):
        ranks = [json.loads((tmp_path / f"run0-{shape}" / f"rank{r}.json").read_text()) for r in range(4)]
        assert [(r["rank"], r["local_rank"], r["node_rank"], r["hostname"]) for r in ranks] == [
            (0, 0, 0, "n1"), (1, 1, 0, "n1"), (2, 0, 1, "n2"), (3, 1, 1, "n2")], shape
        assert {(r["world_size"], r["local_world_size"], r["nnodes"]) for r in ranks} == {(4, 2, 2)}
        assert ranks[0]["w"] == pytest.approx(expected_weights(5, 4), abs=1e-5)


# The Slurm guide's torchrun line as it is written there: `python -u -m torch.distributed.run`, a c10d rendezvous and
# `--node_rank \$SLURM_PROCID` escaped so that it expands inside the step. Two additions for this one-host cluster,
# in srun's line: the agent on n1 does not recognise n1 as itself, so it is told to host the c10d store (is_host=1),
# which a real cluster never needs; and a random pause before each node's agent joins, so that the join order
# varies from job to job.
C10D_BODY = "\n".join([
    'export PATH="$(dirname "$PY"):$PATH"',  # `python` is the test's interpreter
    "GPUS_PER_NODE=2",
    "NNODES=$SLURM_NNODES",
    "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)",
    "MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))",
    'LAUNCHER="python -u -m torch.distributed.run \\',
    '    --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank \\$SLURM_PROCID \\',
    '    --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT --rdzv_backend c10d --max_restarts 0 "',
    'srun --kill-on-bad-exit=1 bash -c "sleep \\$((RANDOM % 3)); $LAUNCHER '
    '--rdzv_conf is_host=\\$(( SLURM_NODEID == 0 ? 1 : 0 )) $WORKER --out $OUT --steps 5 --step-time 0"',
])


def test_9_the_guides_c10d_torchrun_launch_is_accepted_in_every_job(cluster: Path, tmp_path: Path) -> None:
    jobs = [submit(tmp_path / f"job{k}", C10D_BODY, "-N2", "--ntasks-per-node=1", "--cpus-per-task=4",
                   name=f"c10d{k}", exports={"SLURMRT_CHECKPOINT_DIR": ""}) for k in range(10)]
    reordered = 0
    for job in jobs:
        info = job.wait(600)
        assert info["JobState"] == "COMPLETED", job.output()[-3000:]
        (ranks,) = runs(job.dir, 4)
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
        assert {(r["world_size"], r["local_world_size"], r["nnodes"]) for r in ranks} == {(4, 2, 2)}
        assert ranks[0]["w"] == pytest.approx(expected_weights(5, 4), abs=1e-5)
        slurm_node = {r["rank"]: int(r["env"]["SLURM_NODEID"]) for r in ranks}
        reordered += any(r["node_rank"] != slurm_node[r["rank"]] for r in ranks)
    print(f"c10d: 10/10 jobs accepted, {reordered} with a group rank other than SLURM_NODEID")


# torchrun's static rendezvous as its workers see it. The real torchrun cannot get this far on a one-host cluster
# (the second node-0 agent fails to bind the store port, see test_7 above); this stand-in starts the workers with
# the variables torchrun's static agent gives them, trusting --node_rank, and its command line is torchrun's.
STATIC_TORCHRUN = """\
import ctypes, os, signal, subprocess, sys
a = sys.argv[1:]
# The workers die with this stand-in, as torchrun's do: the test cluster's proctrack/linuxproc loses track of a
# killed task's orphans, which would wait in their rendezvous for 30 minutes.
die_with_parent = lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
opt = lambda name: a[a.index(name) + 1]
n, nodes, node = int(opt("--nproc_per_node")), int(opt("--nnodes")), int(opt("--node_rank"))
cmd = a[a.index("--master_port") + 2:]
procs = [subprocess.Popen([sys.executable, *cmd], env={**os.environ, "RANK": str(node * n + i), "LOCAL_RANK": str(i),
         "WORLD_SIZE": str(nodes * n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": str(node),
         "GROUP_WORLD_SIZE": str(nodes), "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": opt("--master_addr"),
         "MASTER_PORT": opt("--master_port")}, preexec_fn=die_with_parent) for i in range(n)]
sys.exit(max(p.wait() for p in procs))
"""


def test_9_static_torchrun_with_a_node_rank_expanded_by_the_batch_shell_is_refused(cluster: Path,
                                                                                  tmp_path: Path) -> None:
    launcher = tmp_path / "bin" / "torchrun"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(STATIC_TORCHRUN)
    body = (f"srun --kill-on-bad-exit=1 --error=$OUT-%t.err $PY {launcher} --nproc_per_node 2 --nnodes 2 "
            "--node_rank $SLURM_PROCID "
            "--master_addr n1 --master_port $((20000 + SLURM_JOB_ID % 10000)) $WORKER --out $OUT --steps 5; exit $?")
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=1", name="static_early",
                 exports={"SLURMRT_CHECKPOINT_DIR": ""})
    info = job.wait(300)
    assert info["JobState"] == "FAILED"
    out = (tmp_path / "run0-1.err").read_text()  # the task on the second node, written by slurmstepd directly
    assert "NodeRankError: the launcher says node rank 0 but this is node 1 of the step" in out, out[-3000:]
    assert "srun bash -c 'torchrun --node_rank=$SLURM_NODEID" in out


def test_9_the_guides_accelerate_launch_runs_across_two_nodes(cluster: Path, tmp_path: Path) -> None:
    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        pytest.fail(f"{accelerate} is missing: the test extra installs accelerate")
    ckpt = tmp_path / "acc-ckpt"
    body = "\n".join([
        f"cd {ROOT}",
        "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)",
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))",
        # The guide's form of the launcher: the module run by `python -u -m`.
        'export PATH="$(dirname "$PY"):$PATH"',
        'srun --kill-on-bad-exit=1 bash -c "python -u -m accelerate.commands.launch --cpu --mixed_precision no '
        '--dynamo_backend no '
        '--num_machines 2 --num_processes 4 --machine_rank \\$SLURM_PROCID --main_process_ip $MASTER_ADDR '
        '--main_process_port $MASTER_PORT --rdzv_conf rdzv_backend=c10d,rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT '
        f'examples/accelerate/train.py --checkpoint-dir {ckpt} --steps 20 --step-time 0 --save-every 10"',
    ])
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=1", "--cpus-per-task=4", name="accelerate_guide")
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED", job.output()[-3000:]
    assert "finished 20 steps" in job.output()
    assert (ckpt / "latest").read_text().strip() == "step_000000019"


# -- the trainers people use -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_10_a_trainer_example_stops_on_the_warning_requeues_and_resumes_on_two_nodes(cluster: Path, tmp_path: Path,
                                                                                  framework: str) -> None:
    pytest.importorskip(framework)
    steps = 60
    args = f"--checkpoint-dir {tmp_path}/ckpt --steps {steps} --step-time 0.2"
    args += f" --output-dir {tmp_path}/out --save-steps 10" if framework == "transformers" else " --save-every 10"
    body = f"srun --kill-on-bad-exit=1 $PY {ROOT}/examples/{framework}/train.py {args}"
    job = submit(tmp_path, body, "-N2", "--ntasks-per-node=1", "--requeue", name=framework)
    wait_for_file(tmp_path / "ckpt" / "latest", 600, job)  # the first checkpoint: the job is training
    slurm("scancel", "--signal=USR1", job.id)  # the warning, to every task of the step (as --signal without B:)
    info = job.wait(900)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    evts = events(tmp_path, job)
    stops = [e for e in evts if e["event"] == "decision" and e["restart"] == 0]
    assert stops and stops[0]["reasons"] == ["signal"], job.output()[-3000:]
    stopped = stops[0]["step"]
    assert stopped < steps
    assert any(e["event"] == "save" and e["restart"] == 0 and e["step"] == stopped for e in evts)
    assert [e["step"] for e in evts if e["event"] == "resume" and e["restart"] == 1] == [stopped]
    assert f"finished {steps} steps" in job.output()


def _accelerate_job(directory: Path, name: str, args: str) -> Job:
    """examples/accelerate/train.sbatch on CPU: 2 nodes x one `accelerate launch` of 2 processes, the B: warning
    forwarded by `slurmrt signal` to the training processes only."""
    accelerate = Path(sys.executable).with_name("accelerate")
    body = "\n".join([
        f"cd {ROOT}",
        'eval "$(slurmrt env)"',
        "trap 'srun --overlap --ntasks-per-node=1 slurmrt signal USR1' USR1",
        f"srun --kill-on-bad-exit=1 bash -c '{accelerate} launch --cpu --mixed_precision no --dynamo_backend no "
        '--num_machines "$NNODES" --machine_rank "$SLURM_NODEID" --num_processes 4 '
        '--main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" '
        f"examples/accelerate/train.py --checkpoint-dir {directory}/ckpt {args}' &",
        "SRUN_PID=$!", 'wait "$SRUN_PID"', 'wait "$SRUN_PID"', "rc=$?", 'echo "srun exited $rc"',
        'case $rc in 0|3|4) ;; *) [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ] && scontrol requeue "$SLURM_JOB_ID" ;; esac',
        "exit $rc",
    ])
    slurmrt_bin = Path(sys.executable).with_name("slurmrt")
    return submit(directory, body, "-N2", "--ntasks-per-node=1", "--cpus-per-task=2", "--requeue", name=name,
                  exports={"PATH": f"{slurmrt_bin.parent}:{os.environ['PATH']}"})


def test_11_accelerate_example_saves_200_times_across_nodes_and_a_preempted_run_ends_with_the_same_weights(
        cluster: Path, tmp_path: Path) -> None:
    import torch

    steps = 200
    # Every step saved (200 commits of one directory that 4 processes on 2 nodes write into), uninterrupted.
    reference = _accelerate_job(tmp_path / "every", "acc_every",
                                f"--steps {steps} --step-time 0 --save-every 1 --weights-out {tmp_path}/every.pt")
    preempted = _accelerate_job(tmp_path / "stopped", "acc_stopped",
                                f"--steps {steps} --step-time 0.1 --save-every 50 --weights-out {tmp_path}/stopped.pt")
    wait_for_file(tmp_path / "stopped" / "ckpt" / "latest", 600, preempted)  # training: the warning now
    slurm("scancel", "--batch", "--signal=USR1", preempted.id)  # B:USR1 -- the batch shell's trap forwards it
    info = reference.wait(900)
    assert info["JobState"] == "COMPLETED", reference.output()[-3000:]
    saves = [e["step"] for e in events(tmp_path / "every", reference) if e["event"] == "save"]
    assert sorted(set(saves)) == list(range(steps)), "every one of the 200 saves committed"  # (+ the final one)
    info = preempted.wait(900)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, preempted.output()[-3000:]
    evts = events(tmp_path / "stopped", preempted)
    (stop,) = [e for e in evts if e["event"] == "decision" and e["restart"] == 0]
    assert stop["reasons"] == ["signal"] and stop["step"] < steps - 1
    assert [e["step"] for e in evts if e["event"] == "resume" and e["restart"] == 1] == [stop["step"]]
    every, stopped = torch.load(tmp_path / "every.pt"), torch.load(tmp_path / "stopped.pt")
    assert every.keys() == stopped.keys() and all(torch.equal(every[k], stopped[k]) for k in every)


# -- examples/megatron: megatron-core GPT, TP=2 across 2 nodes, torchrun inside srun (the sbatch's shape, on CPU) --

MEGATRON_STEPS = 200


def _megatron_job(directory: Path, name: str, args: str, *sbatch_args: str,
                  exports: dict[str, str] | None = None, steps: int = MEGATRON_STEPS) -> Job:
    slurmrt_bin = Path(sys.executable).with_name("slurmrt")
    body = "\n".join([
        f"cd {ROOT}",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))",
        "export NNODES=$SLURM_NNODES",
        "trap 'srun --overlap --ntasks-per-node=1 slurmrt signal USR1' USR1",
        "srun --kill-on-bad-exit=1 bash -c '$PY -m torch.distributed.run --nnodes \"$NNODES\" --nproc-per-node 1 "
        '--node-rank "$SLURM_NODEID" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" '
        f"examples/megatron/train_core.py --tp 2 --checkpoint-dir {directory}/ckpt --steps {steps} "
        f"--weights-out {directory}/w --losses-out {directory}/losses {args}' &",
        "SRUN_PID=$!", 'wait "$SRUN_PID"', 'wait "$SRUN_PID"', "rc=$?", 'echo "srun exited $rc"',
        # torchrun exits 1 whatever its child's code: the batch script requeues a failure a few times. The count is
        # Slurm's, which the deadline's own requeues raise too: under CI's load the time-limit job needs up to five
        # runs, and a cap of 3 left a late run's failure unrequeued (FAILED), with no word of its cause.
        'case $rc in 0|3|4) ;; *) [ "${SLURM_RESTART_COUNT:-0}" -lt 8 ] && scontrol requeue "$SLURM_JOB_ID" ;; esac',
        "exit $rc",
    ])
    return submit(directory, body, "-N2", "--ntasks-per-node=1", "--cpus-per-task=2", "--requeue", *sbatch_args,
                  name=name, exports={"PATH": f"{slurmrt_bin.parent}:{os.environ['PATH']}", "PY": sys.executable,
                                      **(exports or {})})


@pytest.fixture(scope="module")
def megatron_jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Job, Path]]:
    pytest.importorskip("megatron.core")
    jobs: dict[str, tuple[Job, Path]] = {}
    for name, args, sbatch_args, exports in [
        ("reference", "--step-time 0", (), {}),
        ("preempted", "--step-time 0.2", (), {}),
        # No --signal: the deadline alone, against a 2-minute limit. Under load (2 cores, two spinners, the other
        # jobs) the start-up took 35 s and Megatron's first save, which starts its writer processes, more than 15 s:
        # a 1-minute limit with 5 s declared for the save was killed mid-save once. 200 steps of 0.5 s still do not
        # fit in one run.
        ("timelimit", "--step-time 0.5", ("--time=2",),
         {"SLURMRT_DEADLINE_MARGIN_S": "5", "SLURMRT_SAVE_TIME_S": "20"}),
    ]:
        d = tmp_path_factory.mktemp(f"megatron-{name}")
        jobs[name] = (_megatron_job(d, f"mcore_{name}", args, *sbatch_args, exports=exports), d)
    return jobs


def _wait_for_reference(job: Job, directory: Path) -> None:
    """The reference run's weights: its files, not its job record, which Slurm drops some minutes after the end
    (MinJobAge) while the other scenarios still run."""
    for rank in range(2):
        wait_for_file(directory / f"w.rank{rank}", 900, job)
    time.sleep(1)  # written by torch.save: let the last one close


def _megatron_weights(directory: Path) -> list[dict[str, Any]]:
    import torch

    return [torch.load(directory / f"w.rank{r}") for r in range(2)]


def _same_weights(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    import torch

    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True))


def test_12_megatron_core_preempted_by_the_forwarded_warning_resumes_with_the_weights_of_an_uninterrupted_run(
        megatron_jobs: dict[str, tuple[Job, Path]]) -> None:
    job, d = megatron_jobs["preempted"]
    wait_for_file(d / "ckpt" / "latest", 600, job)  # the first periodic checkpoint: Megatron's saver has started
    slurm("scancel", "--batch", "--signal=USR1", job.id)  # B:USR1, forwarded by the trap to the workers only
    info = job.wait(900)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, job.output()[-3000:]
    evts = events(d, job)
    (stop,) = [e for e in evts if e["event"] == "decision" and e["restart"] == 0]
    assert stop["reasons"] == ["signal"]
    assert any(e["event"] == "save" and e["restart"] == 0 and e["step"] == stop["step"] for e in evts), \
        "the stop save went through Megatron's saver (its helper process survived the warning)"
    assert [e["step"] for e in evts if e["event"] == "resume" and e["restart"] == 1] == [stop["step"]]
    ref_job, ref = megatron_jobs["reference"]
    _wait_for_reference(ref_job, ref)
    assert _same_weights(_megatron_weights(d), _megatron_weights(ref))
    losses = [line.split() for line in (d / "losses").read_text().splitlines()]
    reference = [line.split() for line in (ref / "losses").read_text().splitlines()]
    trained_again = {s for s, _ in losses} - {s for s, _ in reference}
    assert not trained_again and dict(losses) == dict(reference), "every step's loss is the uninterrupted run's"


def test_12_megatron_core_stops_before_the_time_limit_without_a_signal_and_finishes(
        megatron_jobs: dict[str, tuple[Job, Path]]) -> None:
    job, d = megatron_jobs["timelimit"]
    info = job.wait(900)
    evts = events(d, job)
    # Every run ended by slurmrt's own decision (the deadline's requeue, then the end): a run that crashed is named
    # first, before the output's tail, which a CI log may cut.
    ends = [(e["restart"], e["outcome"], e.get("why")) for e in evts if e["event"] == "exit"]
    said = f"{info.get('JobState')}, restarts {info.get('Restarts')}, exits {ends}\n{_last_run(job.output())}"
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, said
    assert [o for _, o, _ in ends] == ["REQUEUED"] * (len(ends) - 1) + ["FINISHED"], said
    first = [e for e in evts if e["restart"] == 0]
    (stop,) = [e for e in first if e["event"] == "decision"]
    assert stop["reasons"] == ["deadline"] and not [e for e in first if e["event"] == "signal"]
    ref_job, ref = megatron_jobs["reference"]
    _wait_for_reference(ref_job, ref)
    assert _same_weights(_megatron_weights(d), _megatron_weights(ref))


def _last_run(output: str, most: int = 4000) -> str:
    """The last run's output (from its "batch start" line), without the libraries' warnings: its start-up and end."""
    last = output[output.rfind("batch start"):]
    kept = [line for line in last.splitlines() if "warn" not in line.lower() and not line.startswith("frame #")]
    text = "\n".join(kept)
    return text if len(text) <= most else f"{text[:most // 2]}\n[...]\n{text[-most // 2:]}"


def test_12_megatron_core_kill_switch_stops_saves_and_is_not_requeued(cluster: Path, tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    d = tmp_path
    # A job that would train for hours: the switch certainly finds it running.
    job = _megatron_job(d, "mcore_killswitch", "--step-time 0.2", steps=100000,
                        exports={"SLURMRT_KILL_SWITCH": str(d / "STOP"), "SLURMRT_WATCH_INTERVAL_S": "1"})
    wait_for_file(d / "ckpt" / "latest", 600, job)
    (d / "STOP").touch()
    info = job.wait(600)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), job.output()[-3000:]
    evts = events(d, job)
    (stop,) = [e for e in evts if e["event"] == "decision"]
    assert stop["reasons"] == ["kill_switch"]
    assert any(e["event"] == "save" and e["step"] == stop["step"] for e in evts)
    assert [e["outcome"] for e in evts if e["event"] == "exit"] == ["KILL_SWITCH"]


def _fault_job(directory: Path, fault: str, *srun_args: str) -> Job:
    return submit(
        directory, f"srun {' '.join(srun_args)} $PY $WORKER --out $OUT --steps 80 --step-time 0.1 --save-every 10 "
                   f"--fault {fault} --fault-at 35",
        "-N2", "--ntasks-per-node=1", "--requeue", name=f"fault-{fault}",
        # The floor is 180 s by default; 5 s keeps the scenario short. The allowance is still learned from the steps.
        exports={"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5"})


@pytest.mark.parametrize(("fault", "srun_args"), [("hang", ("--kill-on-bad-exit=1",)),
                                                  ("kill", ("--kill-on-bad-exit=0",))])
def test_13_a_hung_or_killed_task_ends_the_run_which_resumes_without_its_node(cluster: Path, tmp_path: Path,
                                                                              fault: str,
                                                                              srun_args: tuple[str, ...]) -> None:
    """Run 0: rank 1 hangs (or dies of SIGKILL) at step 35. slurmrt names it, requeues the job and excludes its
    node; run 1 runs on two other nodes, resumes from the last checkpoint and finishes with the right weights."""
    job = _fault_job(tmp_path, fault, *srun_args)
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, job.output()[-4000:]
    ev = events(tmp_path, job)
    (suspects,) = [e for e in ev if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [1], suspects
    (bad,) = suspects["nodes"]
    (excluded,) = [e for e in ev if e["event"] == "exclude"]
    assert excluded["added"] == [bad], excluded
    assert bad in info.get("ExcNodeList", ""), info.get("ExcNodeList")
    later = runs(tmp_path, 2)[1:]
    assert len(later) == 1 and all(r["hostname"] != bad for r in later[0]), "run 1 landed on the excluded node"
    resumed_after = later[0][0]["start"] - 1
    saved_in_run0 = {e["step"] for e in ev if e["event"] == "save" and e["restart"] == 0}
    assert resumed_after == max(saved_in_run0) and resumed_after < 35
    assert_trained_exactly_once_from(later, resumed_after + 1, 80, 2)
    hang = [e for e in ev if e["event"] == "hang" and e["restart"] == 0]
    assert hang and all(e.get("stacks") for e in hang)


# -- In-job recovery: `slurmrt run --spare-nodes` in an allocation with --no-kill --

INJOB_STEPS = 80
INJOB_EXPORTS = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def uninterrupted(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The worker's weights after an uninterrupted run of INJOB_STEPS steps on 2 ranks, on this cluster."""
    d = tmp_path_factory.mktemp("injob-reference")
    job = submit(d, f"srun --kill-on-bad-exit=1 $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0 "
                    "--save-every 10", "-N2", "--ntasks-per-node=1", name="injob-reference")
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED", job.output()[-3000:]
    (ranks,) = runs(d, 2)
    return list(ranks[0]["w"])


def _injob_job(directory: Path, name: str, nodes: int, command: str, *sbatch_args: str, local: bool = False) -> Job:
    """``local``: a node-local tier too; each node's directory is its own (the node's name under it), as /dev/shm is
    on a real cluster."""
    exports = {**INJOB_EXPORTS, **({"SLURMRT_LOCAL_CHECKPOINT_DIR": str(directory / "local")} if local else {})}
    prepare = f"mkdir -p {directory / 'local'}; " if local else ""
    return submit(directory, f"{prepare}exec $PY -m slurmrt run {command}", f"-N{nodes}", "--ntasks-per-node=1",
                  "--no-kill", "--requeue", *sbatch_args, name=name, exports=exports)


def _lose_until_requeued(job: Job, node: str) -> None:
    """``node`` fails (set down) and stays out until the job's requeued run has started, then returns to service for
    the other scenarios."""
    try:
        slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=slurmrt-test-node-failure")
        # A dead node stays out until it is repaired; here its slurmd answers, and ReturnToService=2 would take it
        # back at once: drained, it stays out as a dead one would.
        slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=slurmrt-test-node-failure")
        # Back to service only once the requeued run holds its nodes (its batch script has started: Restarts and
        # RUNNING alone are both true before the requeue has ended the first run).
        deadline = time.monotonic() + 600
        while "restart=1 at" not in job.output():
            assert time.monotonic() < deadline, job.output()[-3000:]
            time.sleep(0.5)
    finally:
        for state in ("resume", "idle"):
            slurm("scontrol", "update", f"nodename={node}", f"state={state}", check=False)


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_14_a_killed_or_hung_process_on_a_healthy_node_is_restarted_on_the_same_nodes(
        cluster: Path, tmp_path: Path, fault: str, uninterrupted: list[float]) -> None:
    """3 nodes, 1 spare: rank 1's task dies of SIGKILL (or hangs) at step 35. slurmrt names its node; `slurmrt run`
    checks it from outside (srun --overlap), finds it in the job and healthy, and starts a new step on the same
    nodes, in the same job (no requeue): the spare is kept for a node that really leaves, and nothing goes into the
    bad-node ledger. The step resumes from the last checkpoint and ends with the weights of an uninterrupted run."""
    job = _injob_job(tmp_path, f"injob-{fault}", 3,
                     f"--spare-nodes 1 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.1 "
                     f"--save-every 10 --local-every 5 --fault {fault} --fault-at 35", local=True)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    ev = events(tmp_path, job)
    (suspects,) = [e for e in ev if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [1], suspects
    (suspect,) = suspects["nodes"]
    (decision,) = [e for e in ev if e["event"] == "recovery"]
    assert decision["class"] == ("process" if fault == "kill" else "hang"), decision
    assert decision["action"] == "in_job_restart" and decision["left_out"] == [] and suspect in decision["kept"]
    assert [(e["node"], e["in_job"], e["failures"]) for e in decision["evidence"]] == [(suspect, True, [])]
    assert not [e for e in ev if e["event"] in ("requeue", "exclude", "in_job_refused")], "the queue was not needed"
    inits = [e for e in ev if e["event"] == "init" and e["rank"] == 0]
    assert [(e.get("attempt", 0), e["restart"]) for e in inits] == [(0, 0), (1, 0)]
    assert inits[0]["nodelist"] == inits[1]["nodelist"] and suspect in inits[1]["nodelist"]
    assert "in-job restart 1 of at most" in out and "left out: none" in out  # slurmrt run's one block
    ledger = Path(os.environ["SLURMRT_NODE_LEDGER"])  # this test's own (tests/conftest.py)
    assert not ledger.exists() or suspect not in ledger.read_text(), "a healthy node went into the ledger"
    replaced = [json.loads((tmp_path / "run0.1" / f"rank{r}.json").read_text()) for r in range(2)]
    saved_before = max(e["step"] for e in ev if e["event"] == "save" and e.get("attempt", 0) == 0)
    assert saved_before == 34 and all(r["start"] == saved_before + 1 for r in replaced)  # 34: the local tier's
    (resumed,) = [e for e in ev if e["event"] == "resume" and e.get("attempt") == 1]
    assert resumed["step"] == 34 and resumed["tier"] == "local"  # each rank's own part, on its own node
    assert all(r["in_job_restarts"] == 1 and r["exit_code"] == 0 for r in replaced)
    assert replaced[1]["hostname"] == suspect, "the spare was spent on a healthy node"
    assert all(r["trained"] == list(range(saved_before + 1, INJOB_STEPS)) for r in replaced)
    assert replaced[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


def test_14_a_process_killed_twice_on_a_healthy_node_is_restarted_twice_on_the_same_nodes_the_spare_unused(
        cluster: Path, tmp_path: Path, uninterrupted: list[float]) -> None:
    """Rank 1's process is SIGKILLed at step 35, and again, in the new step, at step 55; its node stays healthy. Both
    are answered in the job on the same nodes: the spare never runs a step, nothing goes into the bad-node ledger,
    and the third step ends with the weights of an uninterrupted run. (Before the evidence, the first fault spent
    the spare and the second found none: the job was requeued with both healthy nodes named as bad.)"""
    job = _injob_job(tmp_path, "injob-twice", 3,
                     f"--spare-nodes 1 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.1 "
                     "--save-every 10 --local-every 5 --fault kill --fault-at 35,55", local=True)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    ev = events(tmp_path, job)
    decisions = [e for e in ev if e["event"] == "recovery"]
    assert [(d["class"], d["action"], d["left_out"]) for d in decisions] == [("process", "in_job_restart", [])] * 2
    inits = [e for e in ev if e["event"] == "init" and e["rank"] == 0]
    assert [e.get("attempt", 0) for e in inits] == [0, 1, 2] and len({tuple(e["nodelist"]) for e in inits}) == 1
    spare = next(n for n in ("n1", "n2", "n3") if n not in inits[0]["nodelist"])
    assert all(spare not in d["kept"] for d in decisions), "the spare was spent on a healthy node"
    assert not [e for e in ev if e["event"] in ("requeue", "exclude", "in_job_refused")], "the queue was not needed"
    ledger = Path(os.environ["SLURMRT_NODE_LEDGER"])  # this test's own (tests/conftest.py)
    assert not ledger.exists() or not any(n in ledger.read_text() for n in inits[0]["nodelist"]), \
        "a healthy node went into the ledger"
    resumed = [e["step"] for e in ev if e["event"] == "resume"]
    assert resumed == [34, 54], resumed  # each from the local tier's last save before its fault
    final = [json.loads((tmp_path / "run0.2" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["in_job_restarts"] == 2 and r["exit_code"] == 0 for r in final)
    assert final[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


def test_14_a_node_that_fails_leaves_the_job_and_the_spare_takes_its_place(cluster: Path, tmp_path: Path,
                                                                           uninterrupted: list[float]) -> None:
    """`scontrol update nodename=n2 state=down` while the step trains on n1 and n2: with --no-kill, Slurm kills the
    step at once (nobody can ask for anything) and drops n2 from the job; `slurmrt run` starts the next step on n1
    and the spare n3, which resumes and ends with the weights of an uninterrupted run."""
    job = _injob_job(tmp_path, "injob-down", 3,
                     f"--spare-nodes 1 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.2 "
                     "--save-every 10")
    wait_for_file(tmp_path / "ckpt" / "latest", 600, job)  # training on n1 and n2, a checkpoint committed
    try:
        slurm("scontrol", "update", "nodename=n2", "state=down", "reason=slurmrt-test-node-failure")
        info = job.wait(600)
    finally:
        for state in ("resume", "idle"):  # back to service for the other scenarios (which one Slurm takes varies)
            slurm("scontrol", "update", "nodename=n2", f"state={state}", check=False)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    assert "n2 left the job (node failure)" in out and "in-job restart 1" in out
    replaced = [json.loads((tmp_path / "run0.1" / f"rank{r}.json").read_text()) for r in range(2)]
    # Killed at once, the first step may not have recorded its last background save yet: the resume tells.
    (resumed,) = [e["step"] for e in events(tmp_path, job) if e["event"] == "resume" and e.get("attempt") == 1]
    assert resumed >= 9 and {r["hostname"] for r in replaced} == {"n1", "n3"}
    assert all(r["start"] == resumed + 1 for r in replaced)
    assert replaced[0]["w"] == uninterrupted


def test_14_a_node_that_fails_with_no_spare_left_is_requeued_without_it(cluster: Path, tmp_path: Path,
                                                                        uninterrupted: list[float]) -> None:
    """`slurmrt run --spare-nodes 0` in a --no-kill job: the step's second node is marked down. Slurm kills the step
    (nobody in it can ask) and the job goes on; the supervisor asks the recovery plan, which has no spare and
    requeues the job. The next run starts without the node, resumes, and ends with the weights of an uninterrupted
    run, every step applied once. (It once ended FAILED: exit 137, Restarts=0, no requeue.) Slurm refuses
    ExcNodeList while a job that lost a node completes (docs/slurm.md): the event log must say which happened."""
    job = _injob_job(tmp_path, "injob-down-nospare", 2,
                     f"--spare-nodes 0 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.2 "
                     "--save-every 10")
    wait_for_file(tmp_path / "ckpt" / "latest", 600, job)  # training on two nodes, a checkpoint committed
    victim = slurm("scontrol", "show", "hostnames", job.info()[0]["NodeList"]).split()[1]  # not the batch node
    _lose_until_requeued(job, victim)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, out[-4000:]
    assert f"{victim} left the job (node failure)" in out and "0 spare(s) left" in out
    ev = events(tmp_path, job)
    (refused,) = [e for e in ev if e["event"] == "in_job_refused"]
    assert refused["nodes"] == [victim] and "but 0 spare(s) left" in refused["why"]
    assert [(e["code"], e["outcome"]) for e in ev if e["event"] == "exit" and e["restart"] == 0] == [(5, "PEER_LOST")]
    assert [e["done"] for e in ev if e["event"] == "requeue"] == [True]
    (excluded,) = [e for e in ev if e["event"] == "exclude"]
    in_slurm = victim in info.get("ExcNodeList", "")
    assert excluded["added"] == ([victim] if in_slurm else []), (excluded, info.get("ExcNodeList"))
    assert in_slurm or "try again" in excluded["message"], excluded
    (resumed,) = [e["step"] for e in ev if e["event"] == "resume" and e["restart"] == 1]
    later = [json.loads((tmp_path / "run1" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["hostname"] != victim and r["exit_code"] == 0 for r in later)
    assert all(r["start"] == resumed + 1 and r["trained"] == list(range(resumed + 1, INJOB_STEPS)) for r in later)
    assert later[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


def test_14_a_node_lost_with_no_spare_is_recorded_in_the_event_log_of_a_checkpoint_dir_given_in_code(
        cluster: Path, tmp_path: Path, uninterrupted: list[float]) -> None:
    """The README's script passes checkpoint_dir= to init(); the batch shell's environment does not name it. A node
    is lost with no spare: `slurmrt run` requeues the job without it, and its decision (evidence, class, action),
    the refusal of the in-job restart, the exit and the requeue are in that script's event log."""
    ckpt = tmp_path / "in-code"
    job = submit(tmp_path, f"unset SLURMRT_CHECKPOINT_DIR; exec $PY -m slurmrt run --spare-nodes 0 -- $PY $WORKER "
                 f"--out $OUT --steps {INJOB_STEPS} --step-time 0.2 --save-every 10 --checkpoint-dir {ckpt}",
                 "-N2", "--ntasks-per-node=1", "--no-kill", "--requeue", name="injob-in-code", exports=INJOB_EXPORTS)
    wait_for_file(ckpt / "latest", 600, job)
    victim = slurm("scontrol", "show", "hostnames", job.info()[0]["NodeList"]).split()[1]  # not the batch node
    _lose_until_requeued(job, victim)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, out[-4000:]
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("events-*")), "the env's log"
    log = ckpt / f"events-{job.id}.jsonl"
    ev = [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["restart"] == 0]
    (decision,) = [e for e in ev if e["event"] == "recovery"]
    assert decision["class"] == "node_lost" and decision["action"] == "requeue", decision
    assert decision["left_out"] == [victim] and decision["evidence"][0]["in_job"] is False
    assert [e["nodes"] for e in ev if e["event"] == "in_job_refused"] == [[victim]]
    assert [e["done"] for e in ev if e["event"] == "requeue"] == [True]
    later = [json.loads((tmp_path / "run1" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["hostname"] != victim and r["exit_code"] == 0 for r in later)
    assert later[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


def test_14_the_batch_node_failing_is_requeued_by_the_guard_job_and_resumes(cluster: Path, tmp_path: Path,
                                                                           uninterrupted: list[float]) -> None:
    """The one node --no-kill cannot cover: the batch script's. Slurm kills `slurmrt run` with it and ends the job
    FAILED, not requeued (docs/slurm.md; the job once ended there). The guard job that `slurmrt run` armed
    (`sbatch --dependency=afternotok:JOB`) runs, finds the batch node gone from the job and no exit recorded,
    requeues the job without it, and writes it into the ledger; the next run resumes and ends with the weights of
    an uninterrupted run."""
    job = _injob_job(tmp_path, "injob-batch-node", 3,
                     f"--spare-nodes 1 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.2 "
                     "--save-every 10")
    wait_for_file(tmp_path / "ckpt" / "latest", 600, job)  # training, a checkpoint committed
    host = job.info()[0]["BatchHost"]
    _lose_until_requeued(job, host)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, out[-4000:]
    assert f"node {host}, the batch script's, failed" in out, out[-4000:]  # the guard's lines, in the job's output
    ev = events(tmp_path, job)
    guards = [e for e in ev if e["event"] == "guard"]
    assert [(e["restart"], e["batch_host"]) for e in guards][:1] == [(0, host)] and guards[0]["guard"], guards
    (ended,) = [e for e in ev if e["event"] == "exit" and e["restart"] == 0]
    assert ended.get("by") == "guard" and ended["code"] == 5, ended
    assert [e["done"] for e in ev if e["event"] == "requeue"] == [True]
    (excluded,) = [e for e in ev if e["event"] == "exclude"]
    assert excluded["added"] == [host] and host in info.get("ExcNodeList", ""), excluded
    listed = subprocess.run([sys.executable, "-m", "slurmrt", "nodes", "--cluster", "slurmrt"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert f"{host}: " in listed.stdout and f"job {job.id}" in listed.stdout, listed.stdout + listed.stderr
    (resumed,) = [e["step"] for e in ev if e["event"] == "resume" and e["restart"] == 1]
    later = [json.loads((tmp_path / "run1" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["hostname"] != host and r["exit_code"] == 0 for r in later)
    assert all(r["start"] == resumed + 1 and r["trained"] == list(range(resumed + 1, INJOB_STEPS)) for r in later)
    assert later[0]["w"] == uninterrupted, "the weights differ from an uninterrupted run's"


def test_14_with_no_spare_a_killed_process_is_restarted_on_the_same_nodes(cluster: Path, tmp_path: Path,
                                                                        uninterrupted: list[float]) -> None:
    """No spare, rank 1 SIGKILLed on a healthy node: no requeue through the queue (it once went there, with the
    healthy node excluded), a new step on the same two nodes."""
    job = _injob_job(tmp_path, "injob-nospare", 2,
                     f"--spare-nodes 0 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.1 "
                     "--save-every 10 --fault kill --fault-at 35")
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, job.output()[-4000:]
    ev = events(tmp_path, job)
    (decision,) = [e for e in ev if e["event"] == "recovery"]
    assert decision["class"] == "process" and decision["action"] == "in_job_restart" and not decision["left_out"]
    assert not [e for e in ev if e["event"] in ("requeue", "exclude", "in_job_refused")]
    later = [json.loads((tmp_path / "run0.1" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["exit_code"] == 0 for r in later) and later[0]["w"] == uninterrupted


def test_14_a_node_lost_in_one_job_is_avoided_by_the_next_job_of_the_same_user(cluster: Path, tmp_path: Path) -> None:
    """The first job loses a node with no spare left: it goes into the user's bad-node ledger (this test's own,
    SLURMRT_NODE_LEDGER). The next job is given that node (-w) and a spare: slurmrt run keeps the ledger's node as
    the spare and trains on the others."""
    first = _injob_job(tmp_path / "first", "ledger-first", 2,
                       f"--spare-nodes 0 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.2 "
                       "--save-every 10")
    wait_for_file(tmp_path / "first" / "ckpt" / "latest", 600, first)
    _lose_until_requeued(first, slurm("scontrol", "show", "hostnames", first.info()[0]["NodeList"]).split()[1])
    info = first.wait(600)
    assert info["JobState"] == "COMPLETED", first.output()[-4000:]
    (bad,) = [e for e in events(tmp_path / "first", first) if e["event"] == "in_job_refused"][0]["nodes"]
    listed = subprocess.run([sys.executable, "-m", "slurmrt", "nodes", "--cluster", "slurmrt"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert f"{bad}: " in listed.stdout and f"job {first.id}" in listed.stdout, listed.stdout + listed.stderr
    others = [n for n in ("n1", "n2", "n3", "n4") if n != bad]
    nxt = _injob_job(tmp_path / "next", "ledger-next", 3,
                     "--spare-nodes 1 -- $PY $WORKER --out $OUT --steps 5 --step-time 0",
                     f"--nodelist={bad},{others[0]},{others[1]}")
    info = nxt.wait(600)
    out = nxt.output()
    assert info["JobState"] == "COMPLETED", out[-4000:]
    assert f"{bad}: in your bad-node ledger" in out and "kept as last-resort spare" in out, out[-3000:]
    (ranks,) = runs(tmp_path / "next", 2)
    assert {r["hostname"] for r in ranks} == {others[0], others[1]}


def _lease_of(directory: Path, job: str, *, cluster: str, heartbeat_age_s: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".slurmrt-lease.json").write_text(json.dumps({
        "owner": job, "job": job, "host": "elsewhere", "pid": 1, "start": 1, "cluster": cluster,
        "heartbeat": time.time() - heartbeat_age_s}))


def test_15_a_lease_held_on_another_cluster_is_not_taken_on_this_clusters_word(cluster: Path, tmp_path: Path) -> None:
    """squeue here does not know a job of another cluster that shares the filesystem: that is no evidence. The lease
    names its cluster; asked there (squeue -M), no answer comes, and the job is refused, losing nothing. A lease of
    this cluster's own whose job Slurm no longer knows, its heartbeat still, is taken over."""
    _lease_of(tmp_path / "ckpt", "424242", cluster="another-cluster", heartbeat_age_s=5)
    job = submit(tmp_path, "srun $PY $WORKER --out $OUT --steps 3 --step-time 0", "-N1", "--ntasks-per-node=1",
                 name="lease-other-cluster")
    info = job.wait(300)
    assert info["JobState"] != "COMPLETED" and "in use by job 424242" in job.output(), job.output()[-3000:]
    assert json.loads((tmp_path / "ckpt" / ".slurmrt-lease.json").read_text())["owner"] == "424242"

    here = tmp_path / "here"
    _lease_of(here / "ckpt", "424243", cluster="slurmrt", heartbeat_age_s=120)
    job = submit(here, "srun $PY $WORKER --out $OUT --steps 3 --step-time 0", "-N1", "--ntasks-per-node=1",
                 name="lease-this-cluster")
    info = job.wait(300)
    out = job.output()
    assert info["JobState"] == "COMPLETED", out[-3000:]
    assert "taking over the lease of job 424243" in out and "Slurm (cluster slurmrt) says job 424243" in out, out


def test_14_the_warning_reaches_the_training_under_torchrun_not_the_launcher(cluster: Path, tmp_path: Path,
                                                                              uninterrupted: list[float]) -> None:
    """--signal=B:USR1 goes to the batch shell only; `slurmrt run` passes it to the training processes (not to
    torchrun, which SIGUSR1 would kill): they stop at one step, save, requeue, and the next run finishes."""
    launcher = ("bash -c \"exec $PY -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank \\$SLURM_NODEID "
                "--master-addr \\$(scontrol show hostnames \\$SLURM_STEP_NODELIST | head -n 1) "
                "--master-port \\$((20000 + SLURM_JOB_ID % 10000)) "
                f"$WORKER --out $OUT --steps {INJOB_STEPS} --step-time 0.2 --save-every 10\"")
    job = _injob_job(tmp_path, "injob-usr1", 3, f"--spare-nodes 1 -- {launcher}")
    wait_for_file(tmp_path / "ckpt" / "latest", 600, job)  # training, and in its first run
    slurm("scancel", "--batch", "--signal=USR1", job.id)
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 1, out[-4000:]
    assert "SIGUSR1: passed to the training processes on n[1-2]" in out and "Start it with exec" not in out
    ev = events(tmp_path, job)
    (stop,) = [e for e in ev if e["event"] == "decision"]
    assert stop["reasons"] == ["signal"] and stop["restart"] == 0
    first, second = runs(tmp_path, 2)
    # The requeue ends every task at once: a rank may not get to write its exit code, the event log has rank 0's.
    assert all(r["stopped_at"] == stop["step"] and r["exit_code"] in (3, None) for r in first)
    assert [e["outcome"] for e in ev if e["event"] == "exit" and e["restart"] == 0] == ["REQUEUED"]
    assert all(r["start"] == stop["step"] + 1 for r in second) and second[0]["w"] == uninterrupted


def _training_pid(job_id: str, procid: int, script: bytes = b"train.py", under_torchrun: bool = False) -> int:
    """The pid of the job's training process of task ``procid`` (its environment says so), on this one-host cluster;
    ``under_torchrun``: the worker torchrun started, not torchrun itself."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if env.get(b"SLURM_JOB_ID") == job_id.encode() and env.get(b"SLURM_PROCID") == str(procid).encode() \
                and script in argv and b"python" in argv.split(b"\0")[0] \
                and (not under_torchrun or b"TORCHELASTIC_RUN_ID" in env):
            return int(entry.name)
    raise LookupError(f"no training process of rank {procid} in job {job_id}")


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_14_a_trainer_example_loses_a_rank_and_finishes_in_the_same_job_with_the_uninterrupted_weights(
        cluster: Path, tmp_path: Path, framework: str) -> None:
    """examples/<framework>/train.py as train_injob.sbatch runs it (CPU, gloo, 1 task per node): rank 1's process
    is SIGKILLed after the first checkpoint; its node is healthy, so a new step runs on the same nodes in the same job
    (the spare kept), and the final weights equal an uninterrupted run's, bit for bit."""
    import torch

    pytest.importorskip(framework)
    steps = 60

    def train(d: Path, step_time: float) -> str:
        args = f"--checkpoint-dir {d}/ckpt --steps {steps} --step-time {step_time} --weights-out {d}/w.pt"
        args += f" --output-dir {d}/out --save-steps 10" if framework == "transformers" else " --save-every 10"
        return f"$PY {ROOT}/examples/{framework}/train.py {args}"

    reference = submit(tmp_path / "ref", f"srun --kill-on-bad-exit=1 {train(tmp_path / 'ref', 0)}", "-N2",
                       "--ntasks-per-node=1", name=f"{framework}-reference")
    job = _injob_job(tmp_path / "injob", f"{framework}-injob", 3,
                     f"--spare-nodes 1 -- {train(tmp_path / 'injob', 0.2)}")
    wait_for_file(tmp_path / "injob" / "ckpt" / "latest", 600, job)  # the first checkpoint: training on n1, n2
    os.kill(_training_pid(job.id, 1), signal.SIGKILL)
    info = job.wait(900)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    ev = events(tmp_path / "injob", job)
    (decision,) = [e for e in ev if e["event"] == "recovery"]  # n2 healthy: the same nodes, the spare kept
    assert decision["class"] == "process" and decision["kept"] == ["n1", "n2"] and "in-job restart 1" in out
    assert [e["step"] for e in ev if e["event"] == "resume" and e.get("attempt") == 1]
    info = reference.wait(900)
    assert info["JobState"] == "COMPLETED", reference.output()[-3000:]
    a, b = torch.load(tmp_path / "ref" / "w.pt"), torch.load(tmp_path / "injob" / "w.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the reference"


def test_14_megatron_core_under_torchrun_loses_a_rank_and_finishes_in_the_same_job_with_the_uninterrupted_weights(
        megatron_jobs: dict[str, tuple[Job, Path]], tmp_path: Path) -> None:
    """examples/megatron/train_core_injob.sbatch's shape on CPU: `slurmrt run --spare-nodes 1` over torchrun in each
    task, TP=2 across 2 nodes, the master read from the step's own nodes. Rank 1's worker is SIGKILLed after the
    first checkpoint; the step is replaced on the spare in the same job, resumes from Megatron's checkpoint, and
    ends with the weights of the uninterrupted reference run, bit for bit."""
    command = ("--spare-nodes 1 -- bash -c 'cd " + str(ROOT) + " && $PY -m torch.distributed.run --nnodes 2 "
               '--nproc-per-node 1 --node-rank "$SLURM_NODEID" '
               '--master-addr "$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)" '
               '--master-port $((20000 + SLURM_JOB_ID % 10000 + SLURM_STEP_ID % 4)) '
               f"examples/megatron/train_core.py --tp 2 --checkpoint-dir {tmp_path}/ckpt --steps {MEGATRON_STEPS} "
               f"--weights-out {tmp_path}/w --losses-out {tmp_path}/losses --step-time 0.2'")
    slurmrt_bin = Path(sys.executable).with_name("slurmrt")
    job = submit(tmp_path, f"exec $PY -m slurmrt run {command}", "-N3", "--ntasks-per-node=1", "--cpus-per-task=2",
                 "--no-kill", "--requeue", name="mcore-injob",
                 exports={**INJOB_EXPORTS, "PY": sys.executable, "PATH": f"{slurmrt_bin.parent}:{os.environ['PATH']}"})
    wait_for_file(tmp_path / "ckpt" / "latest", 900, job)  # the first periodic checkpoint: training on n1, n2
    os.kill(_training_pid(job.id, 1, b"train_core.py", under_torchrun=True), signal.SIGKILL)
    info = job.wait(1200)
    out = job.output()
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) == 0, out[-4000:]
    ev = events(tmp_path, job)
    (decision,) = [e for e in ev if e["event"] == "recovery"]  # n2 healthy: the same nodes, the spare kept
    assert decision["class"] == "process" and decision["kept"] == ["n1", "n2"], decision
    assert not [e for e in ev if e["event"] == "requeue"], out[-3000:]
    assert [e["step"] for e in ev if e["event"] == "resume" and e.get("attempt") == 1]
    ref_job, ref = megatron_jobs["reference"]
    _wait_for_reference(ref_job, ref)
    assert _same_weights(_megatron_weights(tmp_path), _megatron_weights(ref))
