"""The simulator and the test cluster leave their neighbours alone: simulated jobs started together get distinct
ids (and ports), and the test cluster stops only the daemons it started and refuses ports another one holds."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrt.launch.ports import master_port_for
from slurmrt.sim import jobids

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"


def test_simulated_jobs_started_together_get_distinct_ids_and_ports(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; from slurmrt.sim import jobids; "
            "job, _ = jobids.reserve(Path(sys.argv[1])); print(job, flush=True); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
             for _ in range(12)]
    try:
        ids = [int(p.stdout.readline()) for p in procs if p.stdout is not None]
    finally:
        for p in procs:
            p.communicate("")
    assert len(set(ids)) == 12
    ports = {master_port_for(str(job), step) for job in ids for step in ("0", "1", "2")}
    assert len(ports) == 12 * 3  # no two jobs share a port, whatever their steps


def test_simulated_ports_stay_clear_of_a_real_slurms_first_jobs(tmp_path: Path) -> None:
    """A Slurm on the same machine numbers its jobs from 1 (the test cluster from 100, beside the integration tests:
    tests/run.sh); a simulated job's ports lie above those of such a Slurm's first 2,845 jobs, every step of them."""
    highest = max(master_port_for(str(job), str(step)) for job in range(1, 2846) for step in range(8))
    for _ in range(200):
        job, path = jobids.reserve(tmp_path)
        assert 100000 <= job <= 999999
        assert min(master_port_for(str(job), str(step)) for step in range(8)) > highest, job
        jobids.release(path)


def test_a_reservation_left_by_a_killed_simulator_is_taken_back(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for block in range(jobids._BLOCKS):  # every block held by a dead simulator
        (tmp_path / f".slurmrt-sim-port-{block}").write_text(f'{{"pid": {gone.pid}, "start": 1, "job": 1}}')
    job, path = jobids.reserve(tmp_path, tries=5000)
    assert path.exists() and str(jobids._block(job)) in path.name
    jobids.release(path)
    assert not path.exists()


def test_the_test_cluster_stops_only_the_daemons_it_started(tmp_path: Path) -> None:
    fake = tmp_path / "slurmd"  # a process named slurmd that belongs to someone else's cluster
    shutil.copy("/bin/sleep", fake)
    other = subprocess.Popen([str(fake), "300"])
    try:
        out = subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SLURMRT_CLUSTER_DIR": str(tmp_path / "cluster")})
        assert out.returncode == 0, out.stderr
        assert other.poll() is None, "cluster.sh stop killed a slurmd it did not start"
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="cluster.sh start needs root")
def test_the_test_cluster_refuses_to_start_when_its_ports_are_taken(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("0.0.0.0", 17003))
        holder.listen()
    except OSError:
        pass  # already held by another program: refused all the same
    try:
        out = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SLURMRT_CLUSTER_DIR": str(tmp_path / "cluster")})
    finally:
        holder.close()
    assert out.returncode == 4 and "is in use" in out.stderr, out.stderr
    assert not (tmp_path / "cluster" / "slurm.conf").exists()


def test_a_fifo_planted_as_a_reservation_is_passed_over_not_waited_on(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The reservations lie in /tmp, which every user shares: one who plants a FIFO under a block's name held
    `slurmrt sim` for ever (reading it waits for a writer). It is taken as a block in use, and another is drawn."""
    blocked = jobids._LOWEST
    os.mkfifo(tmp_path / f".slurmrt-sim-port-{blocked}")
    draws = iter([jobids._FIRST * jobids._BLOCKS + blocked, jobids._FIRST * jobids._BLOCKS + blocked + 1])
    monkeypatch.setattr(jobids, "_draw", lambda: next(draws))
    job, path = jobids.reserve(tmp_path)
    assert jobids._block(job) == blocked + 1 and path.exists()
    assert (tmp_path / f".slurmrt-sim-port-{blocked}").is_fifo()  # left alone: it is not ours to remove
    jobids.release(path)
