"""The files through which ``slurmrt sim`` and its shims (srun, scontrol, squeue, scancel) talk: one directory per
simulated job, named by ``$SLURMRT_SIM_DIR``."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
from pathlib import Path
from typing import Any

from .spec import JobSpec

ENV = "SLURMRT_SIM_DIR"


class SimState:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @classmethod
    def from_env(cls) -> SimState:
        try:
            return cls(Path(os.environ[ENV]))
        except KeyError:
            raise SystemExit(f"not inside `slurmrt sim` (${ENV} is unset)") from None

    # -- the job ---------------------------------------------------------------------------------------------------
    def write_job(self, spec: JobSpec, restart: int, submit_dir: str, started: float) -> None:
        data = dataclasses.asdict(spec)
        data["script"] = str(spec.script) if spec.script else None
        data["signal"] = int(spec.signal) if spec.signal else None
        data.update({"restart": restart, "submit_dir": submit_dir, "started": started})
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "job.json").write_text(json.dumps(data))
        for name in ("requeue", "cancel", "tasks", "steps", "exits"):  # each run starts at step 0, as in Slurm
            (self.dir / name).unlink(missing_ok=True)

    def read_job(self) -> tuple[JobSpec, dict[str, Any]]:
        data = json.loads((self.dir / "job.json").read_text())
        extra = {k: data.pop(k) for k in ("restart", "submit_dir", "started")}
        data["command"] = tuple(data["command"])
        data["node_names"] = tuple(data["node_names"])
        data["script"] = Path(data["script"]) if data["script"] else None
        data["signal"] = signal.Signals(data["signal"]) if data["signal"] else None
        return JobSpec(**data), extra

    # -- steps and tasks -------------------------------------------------------------------------------------------
    def next_step(self) -> int:
        with open(self.dir / "steps", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            count = len(f.read().splitlines())
            f.write("step\n")
            return count

    def add_tasks(self, rows: list[tuple[int, int, int]]) -> None:
        """(pid, node, rank) of the tasks a step started."""
        with open(self.dir / "tasks", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write("".join(f"{pid} {node} {rank}\n" for pid, node, rank in rows))

    def tasks(self) -> list[tuple[int, int, int]]:
        path = self.dir / "tasks"
        if not path.exists():
            return []
        return [tuple(int(x) for x in line.split()) for line in path.read_text().splitlines() if line.strip()]  # type: ignore[misc]

    def add_task_exit(self, step: int, rank: int, code: int) -> None:
        """A task of ``step`` ended with ``code`` (negative: killed by that signal)."""
        with open(self.dir / "exits", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"{step} {rank} {code}\n")

    def task_exits(self) -> dict[int, int]:
        """Exit codes by rank of the run's largest step (the training step, not a `srun --overlap` helper)."""
        path = self.dir / "exits"
        steps: dict[int, dict[int, int]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                step, rank, code = (int(x) for x in line.split())
                steps.setdefault(step, {})[rank] = code
        return max(steps.values(), key=len, default={})

    # -- requests from the shims -----------------------------------------------------------------------------------
    def request(self, name: str) -> None:
        (self.dir / name).touch()

    def requested(self, name: str) -> bool:
        return (self.dir / name).exists()
