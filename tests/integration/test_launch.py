"""Real processes in each launch shape: the topology they derive lets gloo rendezvous and all_reduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .launch import ROOT, free_port, start, step_env, wait_all

pytestmark = pytest.mark.timeout(180)
QUICKSTART = ROOT / "examples" / "quickstart" / "train.py"


def test_srun_shaped_step_of_four_tasks_rendezvous_and_all_reduce(tmp_path: Path) -> None:
    procs = start(4, tmp_path, ["--steps", "5"], script=QUICKSTART)
    assert wait_all(procs, timeout=150) == [0] * 4
    out = "".join((tmp_path / f"rank{r}.log").read_text() for r in range(4))
    for r in range(4):
        assert f"rank {r}/4 local {r}/4 node 0/1 master localhost:" in out
    assert "finished 5 steps" in out


def test_torchrun_on_a_workstation_without_slurm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = str(ROOT / "src")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(QUICKSTART),
                          "--steps", "5"], env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 1/2 local 1/2 node 0/1" in out.stdout and "finished 5 steps" in out.stdout


def test_no_slurm_no_launcher_runs_as_one_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    out = subprocess.run([sys.executable, str(QUICKSTART), "--steps", "3"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "rank 0/1 local 0/1 node 0/1" in out.stdout


def test_batch_shell_without_srun_warns_that_other_tasks_never_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
                "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1"})
    code = "import logging, slurmrt; logging.basicConfig(); rt = slurmrt.init(); print(rt.world_size)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1"
    assert "the other 3 tasks will never start" in out.stderr


def test_nnodes_mismatch_fails_every_rank_within_seconds_before_any_rendezvous(tmp_path: Path) -> None:
    procs = start(4, tmp_path, ["--steps", "5"], script=QUICKSTART, extra={"NNODES": "2"})
    codes = wait_all(procs, timeout=600)  # a rendezvous would wait 30 minutes; wait_all kills and fails past 600 s
    assert codes == [78] * 4  # ExitCode.CONFIG: no batch script requeues it
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(4)]
    said = "slurmrt: NodeCountError: NNODES=2 but this step runs on 1 nodes"
    assert said in logs[0] and "Traceback" not in logs[0], logs[0]  # one line, once per node: its local rank 0
    assert logs[1:] == ["", "", ""], logs[1:]


def test_a_misconfiguration_found_after_init_is_said_once_per_node_and_exits_78(tmp_path: Path) -> None:
    """A ConfigError from a call after init() (here save(tier='local') with no local directory, after the agreement
    ran and torch's excepthook was installed over slurmrt's) ends the job as one raised by init() does: one line from
    the node's first task, no traceback, 78 on every task. It was a traceback per rank and exit 1, which a batch
    script or `slurmrt run` answers by trying again."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent("""\
        import slurmrt, torch.distributed as dist
        rt = slurmrt.init(checkpoint_dir="ckpt")
        dist.init_process_group("gloo")
        rt.should_stop(0)
        rt.save({"w": 1}, step=0, tier="local")
        print("not reached")
        """))
    codes = wait_all(start(3, tmp_path, [], script=script), timeout=600)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(3)]
    assert codes == [78] * 3, logs
    said = "slurmrt: ConfigError: save(..., tier='local') needs a node-local directory"
    assert said in logs[0] and "Traceback" not in logs[0], logs[0]
    # The others say nothing of their own. torch's store client may log that the store went away (rank 0 hosts it
    # and left first): torch's line, as at the end of any job whose rank 0 exits first, not slurmrt's or Python's.
    assert not any("slurmrt" in log or "Traceback" in log for log in logs[1:]), logs[1:]


def test_a_task_whose_own_init_failed_does_not_wait_for_a_first_task_that_passed(tmp_path: Path) -> None:
    """Task 1 alone is misconfigured (as when the batch shell expanded $SLURM_PROCID: task 0 alone is right). The
    node's first task passed init() and will never say task 1's error: task 1 says it itself at once, not after
    waiting for a line that never comes (the script makes that wait an hour: the test would fail by its timeout)."""
    script = tmp_path / "own.py"
    go = tmp_path / "go"
    script.write_text(textwrap.dedent(f"""\
        import pathlib, time
        import slurmrt.runtime.misconfigured as misconfigured
        misconfigured.WAIT_S = 3600.0
        import slurmrt
        rt = slurmrt.init()
        while not pathlib.Path({str(go)!r}).exists():  # task 0 lives on, as one blocked in the rendezvous would
            time.sleep(0.05)
        """))
    port = free_port()
    # A job id of its own: the node's markers are per launch (job, step, restart, parent), and the other tests'
    # launches here share all four, so one's "said" marker would read as this launch's within the minute.
    job = str(os.getpid())
    procs = []
    for rank, extra in ((0, {}), (1, {"SLURMRT_SAVE_THREADS": "many"})):
        with open(tmp_path / f"rank{rank}.log", "ab") as log:
            procs.append(subprocess.Popen([sys.executable, str(script)], stdout=log, stderr=subprocess.STDOUT,
                                          env=step_env(rank, 2, tmp_path, extra=extra, port=port, job_id=job),
                                          cwd=tmp_path))
    try:
        assert procs[1].wait(timeout=150) == 78
    finally:
        go.touch()
    assert procs[0].wait(timeout=150) == 0
    log = (tmp_path / "rank1.log").read_text()
    assert "slurmrt: ConfigError: option save_threads='many' is invalid" in log and "Traceback" not in log, log


def test_a_misconfiguration_that_the_script_catches_is_its_own_to_handle(tmp_path: Path) -> None:
    """Only an uncaught ConfigError ends the script with 78: code that catches it goes on, and any other uncaught
    error after it is Python's ordinary traceback and exit 1."""
    script = tmp_path / "catches.py"
    script.write_text("import slurmrt\n"
                      "try:\n    slurmrt.init(nnodes=2)\nexcept slurmrt.NodeCountError as err:\n"
                      "    print('caught:', err.details)\n"
                      "raise RuntimeError('the script failed on its own')\n")
    codes = wait_all(start(1, tmp_path, [], script=script), timeout=600)
    log = (tmp_path / "rank0.log").read_text()
    assert codes == [1], log
    assert "caught: {'declared': 2, 'actual': 1}" in log and "RuntimeError: the script failed on its own" in log


def test_an_exception_during_the_agreement_rounds_exits_1_after_the_earlier_atexit_handlers(tmp_path: Path) -> None:
    """A rank whose loop raises exits 1, not SIGABRT from gloo's teardown, and the atexit handlers registered
    before slurmrt's (a tracker's flush) still run; its peer, whose agreement then fails, does the same."""
    script = tmp_path / "raises.py"
    script.write_text(textwrap.dedent("""
        import atexit, time, slurmrt
        rt = slurmrt.init()
        import torch.distributed as dist
        dist.init_process_group("gloo")
        atexit.register(lambda: open(f"flushed-{rt.rank}", "w").close())
        for step in range(10**6):
            time.sleep(0.01)
            if rt.should_stop(step):
                break
            if step == 20 and rt.rank == 1:
                raise RuntimeError("boom")
        rt.exit()
    """))
    procs = start(2, tmp_path, [], script=script, extra={"SLURMRT_DEADLINE": "0"})
    assert wait_all(procs, timeout=300) == [1, 1]
    assert "RuntimeError: boom" in (tmp_path / "rank1.log").read_text()
    assert sorted(p.name for p in tmp_path.glob("flushed-*")) == ["flushed-0", "flushed-1"]


def test_close_with_a_background_save_in_flight_commits_it_and_exits_cleanly(tmp_path: Path) -> None:
    """A script that leaves with close() right after a non-blocking save: the save's thread is inside a gloo
    collective, and an interpreter that ended under it died of SIGABRT ("terminate called ..."), the checkpoint lost.
    close() lets the save commit first."""
    script = tmp_path / "close_early.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist, slurmrt
        rt = slurmrt.init(checkpoint_dir="ckpt")
        dist.init_process_group("gloo")
        for step in range(3):
            rt.should_stop(step)
        rt.save({"w": torch.randn(4_000_000)}, step=3, blocking=False)
        rt.close()
        dist.destroy_process_group()
    """))
    procs = start(2, tmp_path, [], script=script, extra={"SLURMRT_DEADLINE": "0"})
    assert wait_all(procs, timeout=150) == [0, 0]
    logs = "".join((tmp_path / f"rank{r}.log").read_text() for r in range(2))
    assert "terminate called" not in logs
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_000000003"


# -- the launcher seen from a training process, through a real process tree --------------------------------------------

SEE_LAUNCHER = """\
import json, os
from slurmrt.launch.launcher import find_launcher, rendezvous_backend
os.chdir("/")  # the launcher's working directory is not this one
found = find_launcher()
if os.environ.get("RANK", "0") == "0":
    print("LAUNCHER", json.dumps([found[0], rendezvous_backend(found[1])] if found else None), flush=True)
"""
TORCHRUN = "--standalone --nproc-per-node 2"
ACCELERATE = "--cpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no"


@pytest.mark.parametrize(("line", "expected"), [
    (f"python -u -m torch.distributed.run {TORCHRUN} see.py", ["torch.distributed.run", "c10d"]),
    (f"python3 -X faulthandler -u -m torch.distributed.run {TORCHRUN} see.py", ["torch.distributed.run", "c10d"]),
    ("python -m torch.distributed.launch --use-env --nproc-per-node 2 see.py", ["torch.distributed.launch", "static"]),
    (f"python -u -m accelerate.commands.launch {ACCELERATE} see.py", ["accelerate", "static"]),
    (f"accelerate launch {ACCELERATE} see.py", ["accelerate", "static"]),
    (f"uv run --offline --no-project --python \"$(command -v python)\" torchrun {TORCHRUN} see.py",
     ["torch.distributed.run", "c10d"]),
    (f"uv run --offline --no-project --python \"$(command -v python)\" python -m torch.distributed.run {TORCHRUN} "
     "see.py", ["torch.distributed.run", "c10d"]),
    (f"env A=B torchrun {TORCHRUN} see.py", ["torch.distributed.run", "c10d"]),
    (f"bash -c 'sleep 0; torchrun {TORCHRUN} see.py; exit $?'", ["torch.distributed.run", "c10d"]),
    (f"cd elsewhere && bin/start-training {TORCHRUN} ../see.py", ["torch.distributed.run", "c10d"]),
    ("python see.py", None),
])
def test_the_training_process_finds_its_launcher_however_the_line_was_written(tmp_path: Path, line: str,
                                                                              expected: list[str] | None) -> None:
    (tmp_path / "see.py").write_text(SEE_LAUNCHER)
    venv_bin = Path(sys.executable).parent
    # A console script installed under another name and path: torchrun's, copied.
    other = tmp_path / "elsewhere" / "bin" / "start-training"
    other.parent.mkdir(parents=True)
    other.write_text((venv_bin / "torchrun").read_text())
    other.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "PATH": f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}",
                "UV_NO_CONFIG": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    if line.startswith("python3 ") and not (venv_bin / "python3").exists():
        pytest.fail(f"{venv_bin}/python3 is missing")
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (said,) = [json.loads(x.split(" ", 1)[1]) for x in out.stdout.splitlines() if x.startswith("LAUNCHER ")]
    assert said == expected
