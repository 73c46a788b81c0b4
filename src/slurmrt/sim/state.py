"""The files through which ``slurmrt sim`` and its shims (srun, scontrol, squeue, scancel) talk: one directory per
simulated job, named by ``$SLURMRT_SIM_DIR``."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
from collections.abc import Iterator
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
        for name in ("requeue", "cancel", "tasks", "steps", "exits", "ended"):  # each run starts at step 0, as in Slurm
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

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Held by srun while it starts a step's tasks and records them. A reader of the tasks waits for it, so a
        signal meant for every task cannot miss one that already runs (a task can say it is ready, and so bring on a
        fault, before a loaded srun has written its pid down)."""
        with open(self.dir / "starting", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def add_tasks(self, step: int, rows: list[tuple[int, int, int]]) -> None:
        """(pid, node, rank) of the tasks ``step`` started."""
        with open(self.dir / "tasks", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write("".join(f"{pid} {node} {rank} {step}\n" for pid, node, rank in rows))

    def tasks(self) -> list[tuple[int, int, int]]:
        """(pid, node, rank) of every task started in this run."""
        return [(pid, node, rank) for pid, node, rank, _ in self._task_rows()]

    def _task_rows(self) -> list[tuple[int, int, int, int]]:
        path = self.dir / "tasks"
        with open(self.dir / "starting", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # no step is half-started
            if not path.exists():
                return []
            rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        return [(int(pid), int(node), int(rank), int(step)) for pid, node, rank, step in rows]

    def record_killed(self, pids: set[int]) -> None:
        """The simulator SIGKILLed these tasks (and their srun with them): record that as their exit."""
        recorded = {(step, rank) for step, rank, _ in self._exit_rows()}
        for pid, _, rank, step in self._task_rows():
            if pid in pids and (step, rank) not in recorded:
                self.add_task_exit(step, rank, -9)

    def add_task_exit(self, step: int, rank: int, code: int) -> None:
        """A task of ``step`` ended with ``code`` (negative: killed by that signal)."""
        with open(self.dir / "exits", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(f"{step} {rank} {code}\n")

    def _exit_rows(self) -> list[tuple[int, int, int]]:
        path = self.dir / "exits"
        if not path.exists():
            return []
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        return [(int(step), int(rank), int(code)) for step, rank, code in rows]

    def task_exits(self) -> dict[int, int]:
        """Exit codes by rank of the run's largest step (the training step, not a `srun --overlap` helper)."""
        steps: dict[int, dict[int, int]] = {}
        for step, rank, code in self._exit_rows():
            steps.setdefault(step, {})[rank] = code
        return max(steps.values(), key=len, default={})

    # -- requests from the shims -----------------------------------------------------------------------------------
    def exclude(self, nodes: list[str]) -> None:
        """``scontrol update ExcNodeList=``: kept across runs, as Slurm keeps it with the job."""
        (self.dir / "excluded").write_text("\n".join(nodes))

    def excluded(self) -> set[str]:
        path = self.dir / "excluded"
        return set(path.read_text().split()) if path.exists() else set()

    def mark_down(self, node: str) -> None:
        """A node failed (``--fail-node`` with ``--no-kill``): it leaves the job, and no later run gets it."""
        with open(self.dir / "down", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(node + "\n")

    def down(self) -> set[str]:
        path = self.dir / "down"
        return set(path.read_text().split()) if path.exists() else set()

    def request(self, name: str) -> None:
        (self.dir / name).touch()

    def requested(self, name: str) -> bool:
        return (self.dir / name).exists()
