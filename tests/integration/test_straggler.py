"""Stragglers across processes: a rank's own time without its wait for a core; what the name costs the node at
the end of the run (conclude() with Slurm's commands stood in on PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slurmrt._comm import SoloComm
from slurmrt.launch.topology import from_environ
from slurmrt.record.events import EventLog, read_events
from slurmrt.recovery import facts, injob
from slurmrt.recovery.conclude import conclude
from slurmrt.recovery.executor import Executor
from slurmrt.recovery.facts import resolve
from slurmrt.recovery.policy import Outcome
from slurmrt.recovery.settings import RecoverySection
from slurmrt.stop import straggler as mod
from slurmrt.stop.decision import Reason, StopDecision

_SCHEDSTAT = Path(mod.SCHEDSTAT)


_TIMED = """
import os, subprocess, sys, time
from pathlib import Path
from slurmrt.stop.straggler import ComputeTimer
timer, cpu, wall = ComputeTimer(window=4), 0.0, 0.0
for _ in range(4):
    c0, w0 = time.thread_time(), time.perf_counter()
    with timer:
        section()
    cpu += time.thread_time() - c0
    wall += time.perf_counter() - w0
print(timer.published[1] / 1e6, cpu / 4, wall / 4, flush=True)
"""

needs_schedstat = pytest.mark.skipif(not _SCHEDSTAT.exists() or len(_SCHEDSTAT.read_text().split()) < 2,
                                     reason="the kernel keeps no per-thread scheduler statistics here")


def _timed(setup: str) -> subprocess.Popen[str]:
    """A process that runs ``setup`` (which defines ``section()``), times four sections, and prints the timer's
    mean, the CPU time and the wall time of a section."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(setup) + _TIMED], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(mod.__file__).parents[2])})


def _slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol that records its calls; a requeue makes the job pending, so that ExcNodeList is taken."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {calls}
        case "$1 $2" in
          "show job") echo "JobId=7 JobState=PENDING ExcNodeList=(null) NodeList=n[1-2]";;
        esac
        """))
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _conclude(tmp_path: Path, reasons: set[Reason], exclude: list[str]) -> tuple[Outcome, list[dict[str, Any]]]:
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n1",
           "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "1", "SLURMD_NODENAME": "n1"}
    topo = from_environ(env)
    events = EventLog(tmp_path / "events.jsonl", job="7", restart=0, rank=0)
    decision = StopDecision(40, frozenset(reasons), True)
    executor = Executor(resolve(RecoverySection(), topo, os.environ, kill_switch=None), events, node=topo.hostname)
    outcome, _ = conclude(decision, executor=executor, comm=SoloComm(), failed_save=False, step=40, exclude=exclude)
    return outcome, list(read_events(events.path))


@needs_schedstat
def test_the_time_a_rank_waits_for_a_core_is_not_its_own() -> None:
    # The timing process and a spinning one share one core: each section lasts about twice its CPU time, the other
    # half waiting in the run queue. The timer's mean is the rank's own time, not the wall time.
    p = _timed("""
        import atexit, os, subprocess, sys
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        # It spins while its parent lives, so that no path out of the test leaves it spinning.
        spin = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {%d}); "
                                 "parent = os.getppid(); print(1, flush=True)\\n"
                                 "while os.getppid() == parent: pass" % core], stdout=subprocess.PIPE)
        atexit.register(spin.kill)
        spin.stdout.readline()  # spinning on the core

        def section():
            sum(range(3_000_000))
    """)
    try:
        out, _ = p.communicate(timeout=300)
    finally:
        p.kill()
    mean, cpu, wall = map(float, out.split())
    assert wall > 1.3 * cpu, (mean, cpu, wall)  # the core was shared
    assert abs(mean - cpu) < abs(mean - wall), (mean, cpu, wall)


def test_a_requeue_leaves_the_straggler_node_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _slurm(tmp_path, monkeypatch)
    outcome, events = _conclude(tmp_path, {Reason.SIGNAL}, ["n2"])  # straggler="exclude": the time limit's requeue
    assert outcome is Outcome.REQUEUED
    said = calls.read_text().splitlines()
    # The job is read before the requeue (after it, Slurm kills the requeuing process within KillWait); the update
    # comes after it (Slurm takes ExcNodeList only from a pending job).
    updates = [k for k, line in enumerate(said) if "ExcNodeList=n2" in line]
    assert "requeue 7" in said and updates and said.index("requeue 7") < updates[0], said
    assert [e["event"] for e in events] == ["exit", "requeue", "exclude"]


def test_a_straggler_stop_under_slurmrt_run_asks_for_a_new_step_instead(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _slurm(tmp_path, monkeypatch)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    monkeypatch.setenv(facts.DIR_ENV, str(run_dir))
    outcome, events = _conclude(tmp_path, {Reason.STRAGGLER}, ["n2"])
    assert outcome is Outcome.REQUEUED  # exit 3: stopped after its checkpoint for a restart, here in the job
    assert not calls.exists(), "no requeue: the supervisor starts a new step"
    assert injob.read_request(run_dir, 0) == {"attempt": 0, "exclude": ["n2"], "code": 3, "node": "n1",
                                              "why": "stopped at step 40 (straggler): a new step without n2, or the "
                                                     "requeue, as `slurmrt run` weighs its spares",
                                              "trigger": "straggler", "planned": True}
    assert [(e["event"], e.get("reasons")) for e in events] == [("in_job_restart", None), ("exit", ["straggler"])]
