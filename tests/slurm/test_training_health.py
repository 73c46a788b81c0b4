"""A transient training-health fault in a real 2-node job: rank 1's loss of step 12 is NaN once, under
``slurmrt.run_restartable``. Every rank stops there before its update; the step is re-run in the same processes and
passes, so the fault was transient and rank 1's node is suspect: the run stops at an agreed step, saves, and requeues
itself with that node in its ``ExcNodeList``. The requeued run trains elsewhere and ends with the weights of a run
nobody faulted."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Job, submit, wait_for_file
from .test_inprocess import TRAIN as INPROCESS_TRAIN

pytestmark = pytest.mark.timeout(1500)

#: The in-process restart's worker as test_inprocess.py runs it (40 steps, each node's local tier its own), under srun.
TRAIN = "srun --kill-on-bad-exit=1 " + INPROCESS_TRAIN


@pytest.fixture(scope="module")
def jobs(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    slurmrt_bin = Path(sys.executable).with_name("slurmrt")
    made = {}
    # A NaN at step 12 in every generation comes back: rewound to certified step 5 (saved every 5 steps, certified 3
    # healthy steps after), steps 6-12 skipped; its comparator skips them too.
    for name, args in (("reference", ""), ("nan", "--nan 0:1:12"), ("repeats", "--nan \"*:1:12\""),
                       ("skipped", "--skip 6-12")):
        d = tmp_path_factory.mktemp(f"health-{name}")
        made[name] = submit(d, f"export PY OUT\n{TRAIN.format(args)}\nexit $?", "-N2", "--ntasks-per-node=1",
                            "--requeue", name=f"health-{name}",
                            exports={"PATH": f"{slurmrt_bin.parent}:/usr/bin:/bin",
                                     "SLURMRT_NODE_LEDGER": str(d / "bad-nodes.json"),
                                     "SLURMRT_HEALTH_CERTIFY_AFTER": "3"})
    yield made
    for job in made.values():
        job.cancel_unfinished()


def _ended(job: Job) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The job's last `scontrol show job` once it ended, and its event log; it must have completed."""
    info = job.wait(600)
    assert info["JobState"] == "COMPLETED", job.output()[-3000:]
    return info, job.events()


def _weights(directory: Path, run: int) -> dict[str, Any]:
    import torch

    return dict(torch.load(directory / f"run{run}" / "weights.pt"))


def test_a_transient_nan_leaves_its_node_out_of_the_requeued_job_which_ends_bitwise_equal(
        jobs: dict[str, Job]) -> None:
    import torch

    job, ref = jobs["nan"], jobs["reference"]
    info, evts = _ended(job)
    assert int(info["Restarts"]) == 1, job.output()[-3000:]
    (health,) = [e for e in evts if e["event"] == "training_health"]
    (transient,) = [e for e in evts if e["event"] == "transient_fault"]
    (suspect,) = health["suspects"]
    assert (health["step"], health["first_rank"], health["action"]) == (12, 1, "rerun"), health
    assert transient["nodes"] == [suspect], transient
    first_exit = next(e for e in evts if e["event"] == "exit")
    assert (first_exit["outcome"], first_exit["action"], first_exit["exclude"]) == ("UNHEALTHY", "requeue",
                                                                                    [suspect]), first_exit
    assert suspect in info.get("ExcNodeList", ""), info
    (rerun,) = [e for e in evts if e["event"] == "init" and e["restart"] == 1 and e.get("rank", 0) == 0]
    assert suspect not in rerun["nodelist"], rerun
    assert suspect in json.loads((job.dir / "bad-nodes.json").read_text())["nodes"]
    wait_for_file(ref.dir / "run0" / "weights.pt", 600, ref)
    got, want = _weights(job.dir, 1), _weights(ref.dir, 0)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_nan_that_comes_back_is_rewound_in_the_job_with_its_batches_skipped_and_ends_bitwise_equal(
        jobs: dict[str, Job]) -> None:
    import torch

    job, ref = jobs["repeats"], jobs["skipped"]
    info, evts = _ended(job)
    assert int(info["Restarts"]) == 0, job.output()[-3000:]
    rerun, rewind = [e for e in evts if e["event"] == "training_health"]
    assert (rerun["step"], rerun["action"], len(rerun["suspects"])) == (12, "rerun", 1), rerun
    assert (rewind["step"], rewind["action"], rewind["certified"], rewind["suspects"]) == (12, "rewind", 5, []), rewind
    # It came back: the data or the model, not the node (no transient fault, nothing left out).
    assert not [e for e in evts if e["event"] == "transient_fault"]
    assert info.get("ExcNodeList") in (None, "", "(null)"), info
    assert [e["step"] for e in evts if e["event"] == "resume"] == [11, 5]  # the local tier's newest, then certified
    wait_for_file(ref.dir / "run0" / "weights.pt", 600, ref)
    got, want = _weights(job.dir, 0), _weights(ref.dir, 0)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_training_health_campaign_at_its_smallest_on_the_test_cluster(
        cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/chaos_health_cluster.py, one seed: one sbatch job of each fault (a NaN once, a NaN each time, a
    loss spike, a flipped bit) and a fault-free one, each found at its step, never resumed from a tainted
    checkpoint, and bitwise equal to its comparator; each transient fault's node left out by the requeue."""
    from benchmarks import chaos_health_cluster

    code = chaos_health_cluster.main(["--seeds", "1", "--first-seed", "11", "--trials", "4", "--clean", "1",
                                      "--keep", str(tmp_path)])
    report = capsys.readouterr().out
    assert code == 0, report
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in report.splitlines() if line.startswith("| ") and not line.startswith("| fault")}
    assert set(rows) == {"nan", "nan-repeats", "spike", "flip", "none"}, report
    assert [rows[k][6] for k in ("nan", "nan-repeats", "spike", "flip")] == ["1", "0", "0", "1"], report  # left out
    assert "5 jobs" in report and "0 failed" in report, report
