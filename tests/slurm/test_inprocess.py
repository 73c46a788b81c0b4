"""A process SIGKILLed under ``slurmrt.run_restartable`` in a real 2-node job: no in-process restart can bring it back,
and the job must go on as it would without the wrapper. Under a plain ``srun --kill-on-bad-exit=1`` the survivor got
srun's SIGTERM while it waited to rejoin, ignored it, was SIGKILLed at KillWait and the job ended 137 with no requeue
and no exit in its event log; now it gives up at the SIGTERM, and the lost peer is a requeue. Under ``slurmrt run`` it
is a new step. Each ends with the weights of a run nobody killed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, Job, submit, wait_for_file

pytestmark = pytest.mark.timeout(900)

INPROCESS = ROOT / "tests" / "integration" / "inprocess_worker.py"
STEPS = 40


def train_line(args: str = "", *, steps: int = STEPS, options: str = "--step-time 0.1 --every 5",
               out: str = "$OUT") -> str:
    """The in-process worker under bash, each node's local tier in a directory of its own (one filesystem here: a
    node-local /dev/shm, as users have it); ``args``: the worker's fault options."""
    return ("bash -c 'export SLURMRT_LOCAL_CHECKPOINT_DIR=$SLURMRT_CHECKPOINT_DIR-local-$SLURMD_NODENAME; "
            f"mkdir -p $SLURMRT_LOCAL_CHECKPOINT_DIR && exec $PY {INPROCESS} --steps {steps} {options} --out {out} "
            f"{args}'")


#: 40 steps of 0.1 s, shared saves every 5; ``{}``: the fault options.
TRAIN = train_line("{}")
#: Rank 1's process dies after its update of step 12, in the first run's first generation only.
KILL = "--kill 0:1:12"
LAUNCHES = {
    "reference": "srun --kill-on-bad-exit=1 " + TRAIN.format(""),
    "srun": "srun --kill-on-bad-exit=1 " + TRAIN.format(KILL),
    "run": "exec slurmrt run -- " + TRAIN.format(KILL),
}


@pytest.fixture(scope="module")
def jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    slurmrt_bin = Path(sys.executable).with_name("slurmrt")
    made = {}
    for name, line in LAUNCHES.items():
        d = tmp_path_factory.mktemp(f"inprocess-{name}")
        made[name] = submit(d, f"export PY OUT\n{line}\nexit $?", "-N2", "--ntasks-per-node=1", "--requeue",
                            name=f"inproc-{name}", exports={"PATH": f"{slurmrt_bin.parent}:/usr/bin:/bin"})
    yield made
    for job in made.values():
        job.cancel_unfinished()


def _weights(directory: Path) -> dict[str, Any]:
    import torch

    (path,) = sorted(directory.glob("run*/weights.pt"))  # rank 0 writes them once, in the run that finished
    return torch.load(path)


def _reference(jobs: dict[str, Job]) -> dict[str, Any]:
    ref = jobs["reference"]
    wait_for_file(ref.dir / "run0" / "weights.pt", 600, ref)
    return _weights(ref.dir)


@pytest.mark.parametrize("launch", ["srun", "run"])
def test_a_process_killed_under_run_restartable_ends_as_an_uninterrupted_run(jobs: dict[str, Job],
                                                                            launch: str) -> None:
    import torch

    job = jobs[launch]
    info = job.wait(600)
    out = job.output()
    assert info["JobState"] == "COMPLETED", out[-3000:]
    evts = job.events()
    (refused,) = [e for e in evts if e["event"] == "in_process"]
    assert refused["action"] == "refused", refused
    first_exit = next(e for e in evts if e["event"] == "exit")
    assert first_exit["outcome"] == "PEER_LOST" and first_exit["restart"] == 0, first_exit
    if launch == "srun":  # the survivor gave up at srun's SIGTERM, not at the end of its rejoin time: a requeue
        assert "SIGTERM arrived" in refused["why"], refused
        assert int(info["Restarts"]) == 1 and first_exit["action"] == "requeue", out[-3000:]
    else:  # slurmrt run told it the task ended, or its srun (--kill-on-bad-exit) ended the step first: a new step
        assert "srun saw task(s) 1 end" in refused["why"] or "SIGTERM arrived" in refused["why"], refused
        assert int(info["Restarts"]) == 0 and first_exit["action"] == "in_job_restart", out[-3000:]
    assert "local checkpoint of step" not in out, "every node's local tier is in use"
    got, want = _weights(job.dir), _reference(jobs)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
