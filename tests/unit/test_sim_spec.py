from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import pytest

from slurmrt import ConfigError
from slurmrt.launch.topology import from_environ
from slurmrt.sim.environ import batch_env, task_env
from slurmrt.sim.spec import JobSpec, parse_sbatch_script, parse_signal_option, parse_time


@pytest.mark.parametrize(("text", "seconds"), [("5", 300), ("1:30", 90), ("0:40", 40), ("1:00:00", 3600),
                                                ("1-0", 86400), ("2-1:30", 2 * 86400 + 5400)])
def test_parse_time_reads_sbatch_formats(text: str, seconds: float) -> None:
    assert parse_time(text) == seconds


def test_parse_time_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="--time='soon'"):
        parse_time("soon")


@pytest.mark.parametrize(("text", "expected"), [("USR1@90", (signal.SIGUSR1, 90, False)),
                                                ("B:USR2@5", (signal.SIGUSR2, 5, True)),
                                                ("SIGTERM", (signal.SIGTERM, 60, False))])
def test_parse_signal_option(text: str, expected: tuple[signal.Signals, float, bool]) -> None:
    assert parse_signal_option(text) == expected


def test_sbatch_directives_are_read_until_the_first_command(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=4 --time=0:30\n"
                      "#SBATCH --signal=B:USR1@10 --requeue --gpus-per-node=4 --open-mode=append\n\n"
                      "srun python train.py\n"
                      "#SBATCH --nodes=8\n")
    spec, ignored = parse_sbatch_script(script, JobSpec())
    assert (spec.nodes, spec.ntasks_per_node, spec.time_s) == (2, 4, 30)
    assert (spec.signal, spec.signal_lead_s, spec.signal_batch, spec.requeue) == (signal.SIGUSR1, 10, True, True)
    assert ignored == ["--gpus-per-node=4"]
    assert spec.open_mode == "a"
    assert spec.script == script


SPEC = JobSpec(nodes=2, ntasks_per_node=2, job_id=77, node_names=("n1", "n2"))


def test_task_environment_is_a_real_step_that_slurmrt_reads_back() -> None:
    envs = [task_env(SPEC, 0, 0, rank, "/work") for rank in range(4)]
    assert envs[3]["SLURM_STEP_NODELIST"] == "n[1-2]" and envs[3]["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)"
    assert [(e["SLURM_PROCID"], e["SLURM_LOCALID"], e["SLURM_NODEID"], e["SLURMD_NODENAME"]) for e in envs] == [
        ("0", "0", "0", "n1"), ("1", "1", "0", "n1"), ("2", "0", "1", "n2"), ("3", "1", "1", "n2")]
    assert envs[2]["SLURM_GTIDS"] == "2,3"
    topo = from_environ(envs[2])
    assert (topo.rank, topo.local_rank, topo.node_rank, topo.world_size, topo.master_addr) == (2, 0, 1, 4, "n1")


def test_restart_count_appears_only_after_a_requeue() -> None:
    assert "SLURM_RESTART_COUNT" not in task_env(SPEC, 0, 0, 0)
    assert task_env(SPEC, 2, 0, 0)["SLURM_RESTART_COUNT"] == "2"


def test_batch_shell_has_no_step_id_and_looks_like_rank_zero() -> None:
    env = batch_env(replace(SPEC, nodes=2), 0, "/work")
    assert "SLURM_STEP_ID" not in env and env["SLURM_PROCID"] == "0" and env["SLURM_NTASKS"] == "4"
    assert from_environ(env).world_size == 1  # slurmrt's batch-shell rule


def test_srun_places_a_step_as_slurm_does_in_the_job() -> None:
    from slurmrt.sim.environ import StepLayout
    from slurmrt.sim.srun import SimSrunError, layout, parse

    spec = JobSpec(nodes=3, ntasks_per_node=2, node_names=("n1", "n2", "n3"))
    argv = ["--kill-on-bad-exit=1", "--nodes=2", "--nodelist=n1,n3", "--ntasks=4", "--ntasks-per-node=2", "python"]
    step = parse(argv)
    assert (step.kill_on_bad_exit, step.nodes, step.nodelist, step.command) == (True, 2, ["n1", "n3"], ["python"])
    assert layout(spec, step, down=set()) == StepLayout(("n1", "n3"), 2)
    assert layout(spec, parse(["-N2", "x"]), down={"n1"}) == StepLayout(("n2", "n3"), 2)  # a down node is skipped
    assert layout(spec, parse(["--exclude", "n2", "x"]), down=set()) == StepLayout(("n1", "n3"), 2)
    assert layout(spec, parse(["--overlap", "--ntasks-per-node=1", "x"]), down=set()).per_node == 1
    assert parse(["--wait=120", "x"]).wait_s == 120 and parse(["--wait", "5", "x"]).command == ["x"]
    with pytest.raises(SimSrunError, match="DOWN"):
        layout(spec, step, down={"n3"})
    with pytest.raises(SimSrunError, match="not in the job"):
        layout(spec, parse(["-w", "n9", "x"]), down=set())
    with pytest.raises(SimSrunError, match="3 node"):
        layout(spec, parse(["-N", "3", "x"]), down={"n2"})
    env = task_env(spec, 0, 1, 3, "/w", StepLayout(("n1", "n3"), 2))
    assert (env["SLURMD_NODENAME"], env["SLURM_NODEID"], env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"]) == \
        ("n3", "1", "n[1,3]", "n[1-3]")
    assert from_environ(env).nodelist == ("n1", "n3")


def test_no_kill_is_read_from_the_batch_script(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=3 --no-kill\n#SBATCH -k\nexec slurmrt run --spare-nodes 1 -- x\n")
    spec, ignored = parse_sbatch_script(script, JobSpec())
    assert spec.no_kill and spec.nodes == 3 and not ignored


def test_the_summary_says_where_a_run_began_from_its_first_step_that_loaded() -> None:
    """A run whose first step was killed in its start-up (before it loaded anything) and whose in-job restart resumed
    from step 299 read "fresh start" in the summary (the goodput benchmark's policy 2): it began at step 299."""
    from datetime import datetime, timedelta, timezone

    from slurmrt.sim.summary import RunRecord, _annotate, _row

    t0 = datetime(2026, 11, 26, 6, 0, tzinfo=timezone.utc)

    def ev(t: float, restart: int, event: str, attempt: int = 0, **kw: object) -> dict[str, object]:
        return {"time": (t0 + timedelta(seconds=t)).isoformat(), "event": event, "job": "9", "restart": restart,
                "attempt": attempt, "rank": 0, **kw}

    events = [ev(0, 0, "init"), ev(1, 0, "fresh_start"), ev(5, 0, "save", step=299, seconds=0.1),
              ev(6, 0, "exit", code=5, outcome="HUNG"),
              ev(10, 1, "init"), ev(11, 1, "in_job_restart", nodes=["n2"], next_attempt=1),
              ev(15, 1, "init", attempt=1), ev(16, 1, "resume", attempt=1, step=299),
              ev(20, 1, "exit", attempt=1, code=0, outcome="FINISHED")]
    events += [ev(30, 2, "init"), ev(31, 2, "exit", code=5, outcome="HUNG")]  # killed before it loaded
    records = [RunRecord(restart=0), RunRecord(restart=1), RunRecord(restart=2)]
    _annotate(records, events)
    assert [(r.loaded, r.resumed_from) for r in records] == [(True, None), (True, 299), (False, None)]
    assert [_row(r)[-1] for r in records] == ["fresh start", "step 299", "-"]
