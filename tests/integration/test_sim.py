"""`slurmrt sim` with real processes: what it does to a job is what Slurm would (docs/slurm.md)."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import expected_weights
from .launch import ROOT, WORKER

pytestmark = pytest.mark.timeout(240)


def sim(tmp: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 200) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    full.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], cwd=tmp, env=full, capture_output=True,
                          text=True, timeout=timeout)


def summary_rows(stdout: str) -> list[dict[str, str]]:
    """The rows of the summary `slurmrt sim` prints last, as dicts keyed by its column titles."""
    lines = stdout[stdout.index("slurmrt sim summary"):].split("\n\n")[0].splitlines()[1:]
    split = [re.split(r"\s{2,}", line.strip()) for line in lines if line.strip()]
    return [dict(zip(split[0], row, strict=True)) for row in split[1:]]


def _script(tmp: Path, body: str) -> Path:
    path = tmp / f"task-{uuid.uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(body))
    return path


def _ready_then_checkpoint(ntasks: int) -> str:
    """Task code: say this task is ready; the last one to be ready then writes a `save` event where the simulator
    follows the job, which is what --after-checkpoint waits for. A fault so timed hits tasks that are all ready."""
    return f"""
        import json, os, pathlib
        pathlib.Path(f"ready-{{os.environ['SLURM_PROCID']}}").touch()
        if len(list(pathlib.Path().glob("ready-*"))) == {ntasks}:
            with open(os.environ["SLURMRT_EVENT_COPY"], "a") as f:
                f.write(json.dumps({{"event": "save", "restart": 0, "rank": 0, "step": 0}}) + "\\n")
    """


def test_time_limit_sends_sigterm_to_every_task_then_sigkill_after_kill_wait(tmp_path: Path) -> None:
    task = _script(tmp_path, """
        import os, pathlib, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: open(f"term-{os.environ['SLURM_PROCID']}", "w").close())
        pathlib.Path(f"ready-{os.environ['SLURM_PROCID']}").touch()
        time.sleep(600)
    """)
    # The limit is 20 s: a task starts in well under a second on an idle machine; 20 s leaves every task time to
    # be running, with its handler, on a loaded 2-core one (the ready files below check that it was).
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "2", "--time", "0:20", "--kill-wait", "1", "--",
              sys.executable, str(task))
    assert "CANCELLED DUE TO TIME LIMIT" in out.stdout and "time limit" in out.stdout
    assert out.returncode == 1
    assert len(list(tmp_path.glob("ready-*"))) == 4, "every task was running when the limit came"
    (row,) = summary_rows(out.stdout)
    assert row["ended by"] == "time limit" and row["tasks"] == "SIGKILL", row  # SIGTERM ignored: killed later
    assert {p.name for p in tmp_path.glob("term-*")} == {"term-0", "term-1", "term-2", "term-3"}


def test_signal_goes_to_the_tasks_or_with_b_only_to_the_batch_shell(tmp_path: Path) -> None:
    # The job's --signal, sent at the preemption that comes once every task is ready (--after-checkpoint).
    task = _script(tmp_path, """
        import os, pathlib, signal, sys, time
        got = lambda *a: (open(f"usr1-{os.environ['SLURM_PROCID']}", "w").close(), sys.exit(0))
        signal.signal(signal.SIGUSR1, got)
    """ + _ready_then_checkpoint(2) + """
        for _ in range(6000):  # until the signal, or until the batch shell's trap ran (B:)
            if pathlib.Path("batch-usr1").exists():
                break
            time.sleep(0.02)
    """)
    fault = ("--preempt-at", "0", "--after-checkpoint", "--grace", "60")
    sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--signal", "USR1@2", *fault, "--", sys.executable, str(task))
    assert sorted(p.name for p in tmp_path.glob("usr1-*")) == ["usr1-0", "usr1-1"]
    for p in [*tmp_path.glob("usr1-*"), *tmp_path.glob("ready-*")]:
        p.unlink()
    batch = tmp_path / "job.sbatch"
    batch.write_text(f"#!/bin/bash\n#SBATCH -N 1 --ntasks-per-node=2 --signal=B:USR1@2\n"
                     f"trap 'touch batch-usr1' USR1\nsrun {sys.executable} {task} &\nwait $!\nwait\n")
    sim(tmp_path, *fault, str(batch))
    assert (tmp_path / "batch-usr1").exists()
    assert not list(tmp_path.glob("usr1-*")), "B: must not reach the tasks unless the script forwards it"


def test_preemption_saves_requeues_and_resumes_with_a_summary(tmp_path: Path) -> None:
    # Run 0 trains until it is stopped (100000 steps is a cap it never reaches): the preemption comes after its
    # first checkpoint, so it certainly hits a running job however fast the machine. Run 1 finishes 40 steps after
    # its resume.
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--signal", "USR1@5", "--preempt-at", "0",
              "--after-checkpoint", "--grace", "10", "--requeue", "--", sys.executable, str(WORKER), "--out",
              str(tmp_path / "out"), "--steps", "100000", "--resume-steps", "40", "--save-every", "10",
              "--step-time", "0.05",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_SAVE_TIME_S": "1",
                   "SLURMRT_METRICS_FILE": str(tmp_path / "slurmrt.prom")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the goodput of both runs, as rank 0 of the last one wrote it at its end
    metrics = (tmp_path / "slurmrt.prom").read_text()
    assert re.search(r"^slurmrt_goodput_ratio\{job=\"\d+\",experiment=\"[^\"]+\"\} 0\.\d+$", metrics, re.M), metrics
    assert 'category="waiting"' in metrics and metrics.endswith("# EOF\n")
    summary = out.stdout[out.stdout.index("slurmrt sim summary"):].split("\n\n")[0]
    rows = summary.splitlines()[2:]
    assert len(rows) == 2
    assert "preemption (requeued)" in rows[0] and "signal" in rows[0] and "fresh start" in rows[0]
    # The code slurmrt chose (3: stopped and requeued), apart from how the run ended. How the requeue then ended the
    # tasks and the batch shell depends on who was faster (SIGTERM, or srun's SIGKILL after rank 0 exited 3).
    first = summary_rows(out.stdout)[0]
    assert (first["exit"], first["ended by"]) == ("3", "preemption (requeued)"), first
    final = json.loads((tmp_path / "out" / "rank0.json").read_text())
    stop = final["start"] - 1
    last = final["trained"][-1]
    assert last == stop + 40 and stop >= 9
    assert "finished" in rows[1] and f"step {last}" in rows[1]
    assert f"step {stop}" in rows[1].split(f"step {last}")[1]  # resumed from the checkpoint of run 0
    assert final["restart_count"] == 1
    assert final["w"] == pytest.approx(expected_weights(last + 1, 2), abs=1e-5)
    # What the user reads (issue 39): slurmrt's own lines with [host:rank], the time and the level, the commits
    # said by rank 0; no warning from the simulator's shims (scontrol requeue ran); no lock file left behind.
    output = out.stdout + out.stderr
    assert re.search(r"^\[n\d+:0\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO slurmrt: checkpoint step \d+ committed",
                     output, re.M), output[-3000:]
    assert "RuntimeWarning" not in output and not list(tmp_path.glob(".slurmrt-*.lock"))


def test_cancel_stops_the_job_without_requeue(tmp_path: Path) -> None:
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--cancel-at", "6", "--requeue", "--", sys.executable,
              str(WORKER), "--out", str(tmp_path / "out"), "--steps", "100000", "--step-time", "0.05",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_SAVE_TIME_S": "1"})
    rows = out.stdout[out.stdout.index("slurmrt sim summary"):].split("\n\n")[0].splitlines()[2:]
    assert len(rows) == 1 and "scancel" in rows[0] and "requeued" not in rows[0]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["reasons"] == ["sigterm"] and r["exit_code"] == 4 for r in ranks)
    assert not list(tmp_path.glob(".slurmrt-*.lock")), "stopped for good: the job's lock file is gone"


def test_a_failed_node_takes_the_step_down_and_the_batch_script_requeues(tmp_path: Path) -> None:
    # The node fails after the first checkpoint of a run that would otherwise train 100000 steps: it certainly
    # fails mid-run. The requeued run finishes 30 steps after its resume.
    batch = tmp_path / "job.sbatch"
    batch.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 2 --ntasks-per-node=1 --requeue",
        f"srun --kill-on-bad-exit=1 {sys.executable} {WORKER} --out {tmp_path}/run${{SLURM_RESTART_COUNT:-0}} "
        "--steps 100000 --resume-steps 30 --step-time 0.05 --save-every 10",
        "rc=$?",
        'case $rc in 0|3|4) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', ""]))
    out = sim(tmp_path, "--fail-node", "1", "--at", "0", "--after-checkpoint", str(batch),
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "task 1: Killed" in out.stderr
    final = json.loads((tmp_path / "run1" / "rank0.json").read_text())
    assert final["start"] >= 10 and final["trained"][-1] == final["start"] + 29
    assert final["w"] == pytest.approx(expected_weights(final["start"] + 30, 2), abs=1e-5)


def test_nothing_outlives_sim_even_a_task_that_ignores_sigterm_and_a_daemonised_child(tmp_path: Path) -> None:
    marker = f"slurmrt-orphan-{uuid.uuid4().hex}"
    task = _script(tmp_path, f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{marker}"], start_new_session=True)
        time.sleep(300)
    """)
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--time", "0:03", "--kill-wait", "1", "--",
              sys.executable, str(task))
    assert "time limit" in out.stdout
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
            or str(task) in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_sim_cli_errors_are_clear(tmp_path: Path) -> None:
    out = sim(tmp_path, "--fail-node", "3", "--at", "1", "-N", "2", "--", "true")
    assert out.returncode == 2 and "--fail-node 3: nodes are numbered 0..1" in out.stderr
    out = sim(tmp_path)
    assert out.returncode == 2 and "nothing to run" in out.stderr


def test_srun_passes_each_tasks_output_on_in_whole_lines(tmp_path: Path) -> None:
    """Four tasks printing unbuffered (print() then writes its pieces separately) into one pipe used to break lines
    ("PROCIDPROCID 3"), which looked like lost tasks; real srun delivers whole lines."""
    task = _script(tmp_path, """
        import os
        rank = os.environ["SLURM_PROCID"]
        for k in range(300):
            print("PROCID", rank, "line", k)
    """)
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "2", "--", sys.executable, str(task))
    assert out.returncode == 0, out.stderr[-2000:]
    body = out.stdout[:out.stdout.index("slurmrt sim summary")]  # the tasks' output, the summary apart
    lines = [line for line in body.splitlines() if not line.startswith("slurmrt sim") and line.strip()]
    assert sorted(lines) == sorted(f"PROCID {r} line {k}" for r in range(4) for k in range(300))


def test_sim_ended_by_sigterm_or_sighup_ends_its_job_like_scancel_and_leaves_nothing(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        marker = f"slurmrt-sim-end-{uuid.uuid4().hex}"
        task = _script(tmp_path, f"""
            import os, signal, sys, time
            def term(*a):
                open(f"term-{{os.environ['SLURM_PROCID']}}", "w").close()
                sys.exit(0)
            signal.signal(signal.SIGTERM, term)
            open(f"ready-{{os.environ['SLURM_PROCID']}}", "w").close()
            time.sleep(300)  # {marker}
        """)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        env.update({"PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"})
        proc = subprocess.Popen([sys.executable, "-m", "slurmrt", "sim", "-N", "2", "--ntasks-per-node", "1",
                                 "--kill-wait", "5", "--", sys.executable, str(task)], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("ready-*"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the tasks never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, output
        assert sorted(p.name for p in tmp_path.glob("term-*")) == ["term-0", "term-1"], output
        assert f"got {sig.name}" in output
        left = [p for p in psutil.process_iter(["cmdline"]) if str(task) in " ".join(p.info["cmdline"] or [])]
        assert left == []
        for p in [*tmp_path.glob("term-*"), *tmp_path.glob("ready-*")]:
            p.unlink()


def test_status_reads_the_jobs_own_event_log_next_to_its_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--", sys.executable,
              str(ROOT / "examples" / "quickstart" / "train.py"), "--steps", "5", "--checkpoint-dir", str(ckpt))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list(ckpt.glob("events-*.jsonl")), "the event log belongs next to the checkpoints"
    status = subprocess.run([sys.executable, "-m", "slurmrt", "status", str(ckpt)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert status.returncode == 0, status.stderr
    assert "step 4" in status.stdout, status.stdout


@pytest.mark.parametrize("task", [1, 0])
def test_a_hung_task_is_found_named_and_its_node_kept_out_of_the_requeued_run(tmp_path: Path, task: int) -> None:
    # A task freezes (SIGSTOP) after the first checkpoint of a run that would otherwise train 100000 steps. Task 0
    # hosts the rendezvous store: frozen, its socket stays open and c10d's requests wait for ever (the chaos
    # campaign found the survivor's watchdog stuck in one, the job hung with no end).
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--requeue", "--hang-task", str(task), "--at", "0",
              "--after-checkpoint", "--", sys.executable, str(WORKER), "--out", str(tmp_path / "out"),
              "--steps", "100000", "--resume-steps", "20", "--step-time", "0.05", "--save-every", "10",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_HANG_FLOOR_S": "3",
                   "SLURMRT_WATCH_INTERVAL_S": "0.5"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = summary_rows(out.stdout)
    assert [r["exit"] for r in rows] == ["5", "0"] and rows[1]["ended by"] == "finished"
    events = [json.loads(line) for line in (tmp_path / "ckpt").glob("events-*.jsonl").__next__().read_text()
              .splitlines()]
    (suspects,) = [e for e in events if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [task]
    bad = suspects["nodes"][0]
    assert f"{bad} excluded: run 1 gets" in out.stdout
    final = json.loads((tmp_path / "out" / "rank1.json").read_text())
    assert final["hostname"] != bad and final["restart_count"] == 1
    # A recovery that worked says INFO: the store's host found frozen (task 0), the frozen rank woken by Slurm's
    # SIGTERM to take its step down. Only a line that needs a person is a WARNING or an ERROR.
    loud = [line for line in (out.stdout + out.stderr).splitlines() if " ERROR " in line or " WARNING " in line]
    assert not loud, loud


def test_a_frozen_rank_woken_after_the_answer_joins_it_rather_than_wait_for_its_own_allowance(tmp_path: Path) -> None:
    # The goodput benchmark: rank 1, frozen early in a run, had a step allowance longer than its freeze and Slurm's
    # kill wait together; rank 0 answered the hang and exited 5; woken (SIGCONT, SIGTERM), rank 1 waited in gloo for
    # a send to the gone peer, wrote nothing and was killed at the kill wait. Here rank 1's allowance is fixed at 10
    # minutes, the kill wait is 2, and woken rank 1 blocks where no collective fails (--block-on-cont). Under slurmrt
    # run, srun's line for rank 0 (exit 5, an answer) tells the stalled rank the answer is made: it joins it (exit 5,
    # its stacks written) instead of being killed.
    out = sim(tmp_path, "-N", "3", "--ntasks-per-node", "1", "--spare-nodes", "1", "--requeue", "--kill-wait", "120",
              "--hang-task", "1", "--at", "0", "--after-checkpoint", "--", sys.executable, str(WORKER),
              "--out", str(tmp_path / "out"), "--steps", "100000", "--resume-steps", "20", "--step-time", "0.05",
              "--save-every", "10", "--rank-env", "1:SLURMRT_HANG_TIMEOUT_S=600", "--block-on-cont", "1",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_HANG_FLOOR_S": "3",
                   "SLURMRT_WATCH_INTERVAL_S": "0.5"}, timeout=280)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-5000:]
    assert "task 1: Killed" not in output, output[-5000:]
    (stacks,) = (tmp_path / "ckpt").glob("stacks-*-0.0-rank1.txt")  # the woken rank wrote its stacks, saying why
    first = stacks.read_text().splitlines()[0]
    assert "srun saw rank 0 (Exited with exit code 5, on n1) end on an answer of slurmrt's own" in first, first
    loud = [line for line in output.splitlines() if " ERROR " in line or " WARNING " in line]
    assert not loud, loud


def test_a_node_failing_the_health_check_is_excluded_and_the_job_runs_elsewhere(tmp_path: Path) -> None:
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--requeue", "--unhealthy-node", "1", "--",
              sys.executable, str(WORKER), "--out", str(tmp_path / "out"), "--steps", "20", "--step-time", "0.02",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_HEALTH_CHECK": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = summary_rows(out.stdout)
    assert len(rows) == 2 and "6" in rows[0]["tasks"] and rows[1]["ended by"] == "finished"
    assert "health check failed on n2" in out.stderr or "health check failed on 127.0.1.2" in out.stderr


def _events(ckpt: Path) -> list[dict[str, Any]]:
    (log,) = ckpt.glob("events-*.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


def _finals(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


#: A slowed node for the straggler tests: 16x, on a timed section of tens of ms (300,000 Python additions), long
#: next to the simulator's 2 ms charging tick.
SLOW = ("--slow-node", "1", "--slow-factor", "16")
COMPUTE = "300000"
#: The straggler tests name at 2.5x, not at the default 1.25x: on this machine's 2 virtual cores under the suite's
#: load, a healthy node's rank ran its section up to 1.85x slower than the others in CPU time (run-queue waits taken
#: out), for 10 s and more, and was named in a requeued run. A node slowed 8x measured 3.4x and 4x under two busy
#: loops, too close to 2.5x to be named within the run's 300 steps every time; 16x keeps it well above.
MARGIN = {"SLURMRT_STRAGGLER_MARGIN": "1.5"}
#: The slowed node's steps take 16x as long in CPU time, and under the suite's load on 2 cores a run of 300 steps
#: took more than 200 s once (CI): the limit is a guard against a hang, not a measure, so it is wide.
STRAGGLER_TIMEOUT_S = 600


@pytest.mark.stragglers
@pytest.mark.timeout(STRAGGLER_TIMEOUT_S + 60)
def test_a_slowed_node_is_named_and_replaced_by_a_spare_in_the_same_run(tmp_path: Path) -> None:
    # Node 1's work takes 16x as long from the start; a run of 300 steps is long enough to be judged (the suspect's
    # window and 3 more, of 20 timed steps) on a machine of any speed: the judgement counts steps, not seconds. The
    # factor is well above what sharing this machine's cores with other processes does to a rank (MARGIN).
    out = sim(tmp_path, "-N", "3", "--ntasks-per-node", "1", "--spare-nodes", "1", *SLOW, "--requeue",
              "--", sys.executable, str(WORKER), "--out", str(tmp_path / "out"), "--steps", "300",
              "--step-time", "0.02", "--compute", COMPUTE,
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_STRAGGLER": "replace", **MARGIN},
              timeout=STRAGGLER_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = _events(tmp_path / "ckpt")
    (named,) = [e for e in events if e["event"] == "straggler"]
    slow = named["node"]
    assert named["straggler"] == 1 and named["ratio"] >= 2.5 and named["action"] == "replace"
    (moved,) = [e for e in events if e["event"] == "in_job_restart"]
    assert moved["nodes"] == [slow]
    decision = next(e for e in events if e["event"] == "decision")
    assert decision["reasons"] == ["straggler"]
    (row,) = summary_rows(out.stdout)  # one run of the job: no requeue
    assert row["ended by"].startswith("finished") and f"without {slow}" in row["ended by"], row
    finals = _finals(tmp_path / "out.1", 2)
    assert all(f["hostname"] != slow and f["in_job_restarts"] == 1 and f["restart_count"] == 0 for f in finals)
    assert finals[0]["start"] == decision["step"] + 1 and finals[0]["trained"][-1] == 299
    assert finals[0]["w"] == pytest.approx(expected_weights(300, 2), abs=1e-5)


@pytest.mark.stragglers
@pytest.mark.timeout(STRAGGLER_TIMEOUT_S + 60)
def test_without_a_spare_the_straggler_is_left_out_of_the_requeued_run(tmp_path: Path) -> None:
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", *SLOW, "--requeue", "--",
              sys.executable, str(WORKER), "--out", str(tmp_path / "out"), "--steps", "300", "--step-time", "0.02",
              "--compute", COMPUTE,
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "SLURMRT_STRAGGLER": "replace", **MARGIN},
              timeout=STRAGGLER_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    events = _events(tmp_path / "ckpt")
    (named,) = [e for e in events if e["event"] == "straggler"]
    slow = named["node"]
    assert [e["nodes"] for e in events if e["event"] == "exclude"] == [[slow]]
    rows = summary_rows(out.stdout)
    assert [r["exit"] for r in rows] == ["3", "0"] and "straggler" in rows[0]["stop reasons"], rows
    assert f"{slow} excluded: run 1 gets" in out.stdout
    finals = _finals(tmp_path / "out", 2)
    assert all(f["hostname"] != slow and f["restart_count"] == 1 for f in finals)
    assert finals[0]["w"] == pytest.approx(expected_weights(300, 2), abs=1e-5)


def test_a_node_that_dies_under_no_kill_is_replaced_by_a_spare_in_the_same_run(tmp_path: Path) -> None:
    # The node fails after the first checkpoint of a run that would train 100000 steps: it certainly fails mid-run.
    out = sim(tmp_path, "-N", "3", "--ntasks-per-node", "1", "--spare-nodes", "1", "--no-kill", "--requeue",
              "--fail-node", "1", "--at", "0", "--after-checkpoint", "--", sys.executable, str(WORKER),
              "--out", str(tmp_path / "out"), "--steps", "100000", "--resume-steps", "20", "--step-time", "0.05",
              "--save-every", "10", env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "--no-kill: the job goes on without it" in out.stdout
    # A recovery that worked reads as one: a block from slurmrt run; no traceback, no thread stacks in the output
    # (they are in the stacks files the block names), at most 15 lines from the failure to the new step.
    output = out.stdout + out.stderr
    assert "Traceback" not in output and "Thread 0x" not in output, output[-4000:]
    (block,) = re.findall(r"in-job restart 1 of at most \d+:\n(?:slurmrt run:   .*\n)+", out.stderr)
    assert re.search(r"took: +\d+\.\d s from the failure to the new step", block), block
    stacks = re.search(r"stacks: +(\S+)", block)
    assert stacks is not None and any("Thread 0x" in Path(f).read_text() for f in glob.glob(stacks[1]))
    lines = out.stderr.splitlines()  # the tasks', srun's and slurmrt run's lines, in order
    first = min(i for i, line in enumerate(lines) if "srun: error" in line or "a peer was lost" in line)
    last = next(i for i, line in enumerate(lines) if line.startswith("slurmrt run:   stacks:"))
    assert last - first + 1 <= 15, "\n".join(lines[first:last + 1])
    (row,) = summary_rows(out.stdout)
    assert row["ended by"].startswith("finished") and "in-job restart(s) without" in row["ended by"], row
    finals = _finals(tmp_path / "out.1", 2)
    dead = row["ended by"].split("without ")[1].split(";")[0]
    assert all(f["hostname"] != dead and f["in_job_restarts"] == 1 and f["restart_count"] == 0 for f in finals)
    assert finals[0]["start"] >= 10 and finals[0]["trained"][-1] == finals[0]["start"] + 19
    assert finals[0]["w"] == pytest.approx(expected_weights(finals[0]["start"] + 20, 2), abs=1e-5)


def test_a_time_limit_too_short_for_a_save_stops_once_without_a_requeue_loop(tmp_path: Path) -> None:
    # 60 s cannot hold the margin (30 s) and a save (30 s, assumed until measured): every run would stop at its
    # first step. Without a checkpoint directory there is no event log for the futile-run guard; it requeued 6 times.
    out = sim(tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--time", "1:00", "--signal", "USR1@20", "--requeue",
              "--", sys.executable, str(ROOT / "examples" / "quickstart" / "train.py"))
    rows = summary_rows(out.stdout)
    assert len(rows) == 1, out.stdout[-3000:]
    assert rows[0]["exit"] == "4" and rows[0]["stop reasons"] == "deadline", rows
    assert "before its first step" in out.stdout + out.stderr and "Raise --time" in out.stdout + out.stderr


def test_a_rehearsed_fault_that_never_fires_fails_the_rehearsal_and_says_why(tmp_path: Path) -> None:
    quickstart = str(ROOT / "examples" / "quickstart" / "train.py")
    # No checkpoint directory: --after-checkpoint waits for a checkpoint that never comes.
    out = sim(tmp_path, "--after-checkpoint", "--preempt-at", "0", "--signal", "USR1@5", "--requeue", "--",
              sys.executable, quickstart)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "not rehearsed: preempt: no checkpoint was committed" in out.stderr
    # A moment after the job's end: it finished before the fault.
    out = sim(tmp_path, "--cancel-at", "100000", "--", sys.executable, quickstart)
    assert out.returncode == 1 and "not rehearsed: cancel: the run ended before its moment" in out.stderr, out.stderr
    # A slowed node in a job that times no compute, or too few steps to judge: nobody can be named. The factor does
    # not matter to the verdict and slows the node's start-up (torch's import) as much as its steps: at the default
    # 4x, with 2 tasks a node, this case alone took 4m47s on an idle 2-core machine, and over 200 s in CI.
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--slow-node", "1", "--slow-factor", "1.5", "--",
              sys.executable, quickstart, "--steps", "5")
    assert out.returncode == 1 and "not rehearsed: slow-node 1: it was slowed, but no straggler was named" in \
        out.stderr, out.stderr[-2000:]


def test_a_clean_rehearsal_leaves_no_state_behind_and_a_failed_one_says_where_it_is(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = sim(tmp_path, "--", sys.executable, str(ROOT / "examples" / "quickstart" / "train.py"), "--steps", "3",
              env={"TMPDIR": str(tmp)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert not list(tmp.glob("slurmrt-sim-*")), "a clean end leaves no state directory"
    out = sim(tmp_path, "--", sys.executable, "-c", "raise SystemExit(1)", env={"TMPDIR": str(tmp)})
    assert out.returncode == 1
    (kept,) = tmp.glob("slurmrt-sim-*")
    assert f"its state is kept in {kept}" in out.stdout


@pytest.mark.timeout(900)
def test_a_fault_trace_replays_over_the_jobs_runs_and_the_job_ends_with_the_weights_of_an_uninterrupted_one(
        tmp_path: Path) -> None:
    train = [sys.executable, str(ROOT / "examples" / "quickstart" / "train.py"), "--steps", "160", "--step-time",
             "0.05", "--save-every", "10", "--checkpoint-dir", "ckpt"]
    env = {"SLURMRT_HANG_FLOOR_S": "5", "SLURMRT_WATCH_INTERVAL_S": "0.5", "SLURMRT_SAVE_TIME_S": "2"}
    (tmp_path / "reference").mkdir()
    reference = sim(tmp_path / "reference", "-N", "2", "--", *train, env=env, timeout=400)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    checksum = re.search(r"weights checksum (\S+)", reference.stdout + reference.stderr)
    assert checksum is not None
    # On training time (each run's clock starts at its first checkpoint): a rank crashes, a node is lost, a rank
    # hangs. A fault that comes while the job is still finding the one before hits the same run.
    (tmp_path / "trace.csv").write_text("time,kind,node\n1.0,rank-crash,1\n2.0,node-loss,0\n3.0,hang,1\n")
    out = sim(tmp_path, "-N", "2", "--trace", "trace.csv", "--after-checkpoint", "--", *train, env=env, timeout=800)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-5000:]
    assert "faults (trace trace.csv): 3 injected (1 node-loss, 1 rank-crash, 1 hang)" in out.stdout, output[-3000:]
    assert f"weights checksum {checksum[1]}" in output  # every step applied once: bitwise the uninterrupted weights
    rows = summary_rows(out.stdout)
    assert 2 <= len(rows) <= 4 and rows[-1]["ended by"] == "finished", rows
    assert all("requeued" in r["ended by"] for r in rows[:-1]), rows
    assert re.search(r"^goodput: \d+\.\d% of .* was productive", out.stdout, re.M), out.stdout[-2000:]


def test_a_step_whose_tasks_all_die_unanswered_under_slurmrt_run_restarts_on_the_same_nodes_not_left_dead(
        tmp_path: Path) -> None:
    # Every rank is SIGKILLed at step 25 of the first run (no slurmrt in the step answers; the same as tasks killed
    # during their start-up). slurmrt run, the batch script's last process, answers the step itself: it found no gone
    # node and no request, checks the nodes (in the job, healthy) and starts a new step on the same nodes, the spare
    # kept. Before, the job ended with exit 137, never requeued; then it was requeued through the queue.
    out = sim(tmp_path, "-N", "3", "--ntasks-per-node", "1", "--spare-nodes", "1", "--no-kill", "--requeue", "--",
              sys.executable, str(WORKER), "--out", str(tmp_path / "out"), "--steps", "60", "--die-at", "25",
              "--die-by-kill", "--step-time", "0.02", "--save-every", "10",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the step ended with exit code 137 before slurmrt in it could say why" in out.stderr, out.stderr[-3000:]
    assert "left out: none (no node evidence): the same nodes (process)" in out.stderr, out.stderr[-3000:]
    (row,) = summary_rows(out.stdout)
    assert row["ended by"].startswith("finished") and "in-job restart(s) on the same nodes" in row["ended by"], row
    finals = _finals(tmp_path / "out.1", 2)
    assert finals[0]["start"] == 20 and finals[0]["w"] == pytest.approx(expected_weights(60, 2), abs=1e-5)


def test_a_rank_crash_on_the_training_clock_is_one_account_in_the_summary_status_and_the_ledger(
        tmp_path: Path) -> None:
    # One rank SIGKILLed at step 30 of 120 (6 s of training: within slurmrt's default 10 s between progress reports,
    # so the simulator must ask for reports often enough for the fault to land while the job trains). Its peer
    # asks for a new step naming the dead rank's node; slurmrt run finds no evidence against it and keeps it. The
    # summary, slurmrt status and the event log must tell that one story: one run in two steps, on the same nodes,
    # the first step ended by a lost peer (not a hang).
    (tmp_path / "trace.csv").write_text("step,kind,node\n30,rank-crash,1\n")
    out = sim(tmp_path, "-N", "3", "--spare-nodes", "1", "--no-kill", "--trace", "trace.csv", "--",
              sys.executable, str(ROOT / "examples" / "quickstart" / "train.py"), "--steps", "120", "--step-time",
              "0.05", "--save-every", "10", "--checkpoint-dir", "ckpt", timeout=600)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-5000:]
    assert "faults (trace trace.csv): 1 injected (1 rank-crash)" in out.stdout, output[-3000:]
    (row,) = summary_rows(out.stdout)
    assert "in-job restart(s) on the same nodes" in row["ended by"] and "without" not in row["ended by"], row
    assert "\n1 run(s) in 2 step(s): 0 requeue(s), 1 in-job restart(s)\n" in out.stdout, out.stdout[-2000:]
    status = subprocess.run([sys.executable, "-m", "slurmrt", "status", "--json", "ckpt"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    (job,) = json.loads(status.stdout)["jobs"]
    assert (job["job_runs"], job["in_job_restarts"]) == (1, 1), job
    assert [(r["outcome"], r["left"]) for r in job["runs"]] == [("PEER_LOST", []), ("FINISHED", [])], job["runs"]
    assert job["totals"]["lost_s"] == pytest.approx(job["goodput"]["seconds"]["lost_work"]), job


def test_a_signal_storm_stops_the_job_once_saves_once_and_the_requeued_run_finishes(tmp_path: Path) -> None:
    # 30 signals (USR1, USR2, TERM, ten rounds) to every task at once, on training time: one agreed stop, one save,
    # one requeue, and every step applied once.
    (tmp_path / "trace.csv").write_text("0.5,signal-storm,0\n")
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--requeue", "--trace", "trace.csv",
              "--after-checkpoint", "--", sys.executable, str(WORKER), "--out", str(tmp_path / "out"), "--steps",
              "60", "--step-time", "0.05", "--save-every", "10", env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-4000:]
    assert "1 injected (1 signal-storm)" in out.stdout and "a signal storm: 30 signals" in out.stdout
    assert len(re.findall(r"all ranks stop at step", output)) == 1, output[-4000:]
    first, second = summary_rows(out.stdout)
    assert "requeued" in first["ended by"] and second["ended by"] == "finished", (first, second)
    finals = _finals(tmp_path / "out", 2)
    assert finals[0]["w"] == pytest.approx(expected_weights(60, 2), abs=1e-5)
    assert finals[0]["start"] == int(first["checkpoint"].split()[-1]) + 1


def test_the_first_node_failing_in_a_no_kill_job_is_requeued_by_the_guard_job_and_finishes(tmp_path: Path) -> None:
    # Measured on the test cluster (docs/slurm.md): Slurm kills the batch step with its node and ends the job FAILED,
    # not requeued, --requeue or not. The guard job `slurmrt run` armed runs then, and requeues it without the node.
    out = sim(tmp_path, "-N", "3", "--ntasks-per-node", "1", "--spare-nodes", "1", "--no-kill", "--requeue",
              "--fail-node", "0", "--at", "0", "--after-checkpoint", "--", sys.executable, str(WORKER),
              "--out", str(tmp_path / "out"), "--steps", "40", "--step-time", "0.05", "--save-every", "10",
              env={"SLURMRT_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    assert out.returncode == 0, out.stdout[-3000:]
    assert "Slurm kills the batch step and ends the job, without a requeue" in out.stdout, out.stdout[-3000:]
    assert "slurmrt guard: job" in out.stdout and "requeue without n1" in out.stdout, out.stdout[-3000:]
    first, second = summary_rows(out.stdout)
    assert "requeued by its guard job" in first["ended by"] and second["ended by"] == "finished", (first, second)
    assert second["resumed from"] == first["checkpoint"] != "-", (first, second)
    assert "n1 excluded: run 1 gets n[2-4]" in out.stdout


def test_srun_wait_ends_a_task_frozen_after_the_others_ended(tmp_path: Path) -> None:
    # The cluster campaign: rank 0, stopped (SIGSTOP) after it had finished, kept its job for ever; `slurmrt run`
    # now starts its step with `srun --wait`, which ends the tasks left that long after the first one ended. srun
    # sends SIGCONT, then SIGTERM, as Slurm does: the frozen task sleeps once resumed; without the sleep, on a loaded
    # machine it could end on its own (exit 0) between the two signals.
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/bash\nsrun --wait=1 sh -c \'[ "$SLURM_PROCID" = 0 ] && kill -STOP $$ && exec sleep 60; '
                      'exit 0\'\necho "srun exit $?"\n')
    out = sim(tmp_path, "-N", "2", "--ntasks-per-node", "1", "--", str(script), timeout=120)
    assert "--wait: 1 s after the first task ended" in out.stderr + out.stdout, out.stdout + out.stderr
    assert "srun exit 0" not in out.stdout, out.stdout


def test_a_trace_without_a_fault_is_said_as_one_with_its_zero_faults(tmp_path: Path) -> None:
    # A trace drawn for a seed may hold no fault: the run is a data point with zero faults, and the summary says so
    # as it does for any trace (the goodput benchmark reads that line; it raised StopIteration on such a seed).
    (tmp_path / "trace.csv").write_text("time,kind,node\n# nothing struck in this seed\n")
    quickstart = str(ROOT / "examples" / "quickstart" / "train.py")
    out = sim(tmp_path, "--trace", "trace.csv", "--", sys.executable, quickstart, "--steps", "3")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "faults (trace trace.csv): 0 injected (none)" in out.stdout, out.stdout[-2000:]
