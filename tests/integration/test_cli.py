"""`slurmrt doctor` against the real resolver."""

from __future__ import annotations

from slurmrt import ParallelConfig
from slurmrt.cli.doctor import doctor


def test_doctor_fails_when_the_master_does_not_resolve() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "slurmrt-no-such-host-[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_END_TIME": "4102444800"}
    report = doctor(env, ParallelConfig(), events_dirs=[])
    assert report.failed
    assert any("FAIL  master: slurmrt-no-such-host-1 does not resolve" in line for line in report.lines)


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`slurmrt doctor | head -n 3` under `set -o pipefail` (install.md): head may exit before doctor's last write.
    That write's EPIPE is what the reader wanted, not an error: exit 0, nothing on stderr. Here the pipe is closed
    before the command writes at all, so the EPIPE comes every time."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-m", "slurmrt", "doctor"], stdout=write, stderr=subprocess.PIPE,
                         env=env, text=True, timeout=300)
    os.close(write)
    assert out.returncode == 0 and "Broken pipe" not in out.stderr and "Traceback" not in out.stderr, out.stderr
