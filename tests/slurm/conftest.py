"""A real Slurm cluster for the scenario tests (tests/slurm/cluster.sh), and helpers to submit and follow jobs.

Without root (and no cluster already running) the scenarios are skipped with a reason; with CI=true a skip is a
failure, so CI cannot go green without them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLUSTER = HERE / "cluster.sh"
WORKER = ROOT / "tests" / "integration" / "worker.py"
CLUSTER_DIR = Path(os.environ.get("SLURMRT_CLUSTER_DIR", "/tmp/slurmrt-cluster"))
CONF = CLUSTER_DIR / "slurm.conf"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "SBATCH", "RANK", "WORLD_SIZE",
                                                                    "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))}
    env["SLURM_CONF"] = str(CONF)
    return env


def slurm(*args: str, check: bool = True) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, env=_env(), timeout=60, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def _running() -> bool:
    if not CONF.exists():
        return False
    try:
        return "UP" in slurm("scontrol", "ping", check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def cluster() -> Iterator[Path]:
    ci = os.environ.get("CI") == "true"

    def give_up(reason: str) -> None:
        if ci:
            pytest.fail(f"CI must run the Slurm scenarios: {reason}")
        pytest.skip(reason)

    started_here = False
    if not _running():
        if os.geteuid() != 0:
            give_up("the Slurm scenarios need a local Slurm cluster: run `sudo tests/slurm/cluster.sh start` once "
                    "(installs slurm-wlm and munge, starts 4 nodes), or run the tests as root")
        out = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            give_up(f"tests/slurm/cluster.sh start failed: {out.stderr.strip()[-2000:]}")
        started_here = True
    yield CONF
    if started_here:
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, text=True, timeout=120)


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", line))


@dataclass
class Job:
    id: str
    dir: Path
    #: (time, state) each time the job's state changed, as seen by wait().
    history: list[tuple[float, str]] = field(default_factory=list)

    def info(self) -> list[dict[str, str]]:
        """One dict per job (several for an array), from `scontrol show job -o` (jobs stay for MinJobAge=300 s)."""
        text = slurm("scontrol", "show", "job", "-o", self.id, check=False)
        return [_fields(line) for line in text.splitlines() if line.strip()]

    def state(self) -> str:
        infos = self.info()
        return infos[0].get("JobState", "UNKNOWN") if infos else "GONE"

    def events(self) -> list[dict[str, Any]]:
        """The job's event log (in the checkpoint directory `submit` gives it), every run's."""
        path = self.dir / "ckpt" / f"events-{self.id}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def cancel_unfinished(self) -> None:
        """scancel the job unless it ended (a test that failed must not leave it holding the cluster's nodes)."""
        if self.state() not in ("COMPLETED", "FAILED", "GONE"):
            slurm("scancel", self.id, check=False)

    def wait_state(self, predicate: object, timeout: float) -> dict[str, str]:
        """Wait until predicate(info) holds for the (first) job."""
        deadline = time.monotonic() + timeout
        while True:
            infos = self.info()
            if infos:
                info = infos[0]
                if not self.history or self.history[-1][1] != info.get("JobState"):
                    self.history.append((time.time(), info.get("JobState", "")))
                if callable(predicate) and predicate(info):
                    return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id}: {infos} after {timeout} s; output:\n{self.output()[-3000:]}")
            time.sleep(0.5)

    def wait(self, timeout: float) -> dict[str, str]:
        return self.wait_state(lambda i: i.get("JobState") in TERMINAL, timeout)

    def wait_all(self, timeout: float) -> list[dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            infos = self.info()
            if infos and all(i.get("JobState") in TERMINAL for i in infos) and \
                    not any("[" in i.get("JobId", "") or "_[" in i.get("ArrayTaskId", "[") for i in infos):
                return infos
            if time.monotonic() > deadline:
                raise TimeoutError(f"array {self.id}: {[(i.get('JobId'), i.get('JobState')) for i in infos]}")
            time.sleep(0.5)

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("slurm-*.out")))


def submit(directory: Path, body: str, *sbatch_args: str, exports: dict[str, str] | None = None,
           name: str = "scenario") -> Job:
    """sbatch a script that runs ``body`` (bash) with the project's Python and slurmrt on the path."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        "#!/bin/bash",
        f"export PYTHONPATH={shlex.quote(str(ROOT / 'src'))} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1",
        f"export SLURMRT_CHECKPOINT_DIR={shlex.quote(str(directory / 'ckpt'))}",
        f"PY={shlex.quote(sys.executable)}",
        f"WORKER={shlex.quote(str(WORKER))}",
        f"OUT={shlex.quote(str(directory))}/run${{SLURM_RESTART_COUNT:-0}}",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (exports or {}).items()]
    lines += ['echo "batch start job=$SLURM_JOB_ID restart=${SLURM_RESTART_COUNT:-0} at $(date +%s)"', body]
    script = directory / f"{name}.sbatch"
    script.write_text("\n".join(lines) + "\n")
    out = slurm("sbatch", "--parsable", f"--job-name=slurmrt-{name}", f"--output={directory}/slurm-%j.out",
                "--open-mode=append", f"--chdir={directory}", *sbatch_args, str(script))
    return Job(id=out.strip().split(";")[0], dir=directory)


def wait_for_file(path: Path, timeout: float, job: Job | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared" + (f"; job output:\n{job.output()[-3000:]}" if job else ""))
        time.sleep(0.2)
