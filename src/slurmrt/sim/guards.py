"""Guard jobs in ``slurmrt sim``: what ``sbatch --dependency=afternotok:JOB --kill-on-invalid-dep=yes`` does.

``slurmrt run`` arms one on its job (:mod:`slurmrt.recovery.guard`). As in Slurm (measured, docs/slurm.md): it stays
pending while the job runs and while it is requeued; when the job completes, it is cancelled; when the job ends
otherwise, it runs, with the job's state readable through ``scontrol show job`` (:func:`ended`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import IO

from .state import SimState
from .summary import RunRecord

#: How long a guard may run (Slurm would give it its time limit; a guard needs seconds).
TIMEOUT_S = 120.0


def submit(state: SimState, command: str) -> str:
    """Keep ``command`` as a pending guard; returns its job id."""
    directory = state.dir / "guards"
    directory.mkdir(exist_ok=True)
    number = len(list(directory.iterdir())) + 1
    guard = f"{state.read_job()[0].job_id}{number:03d}"
    (directory / f"{guard}.json").write_text(json.dumps({"id": guard, "command": command}))
    return guard


def cancel(state: SimState, guard: str) -> bool:
    """``scancel GUARD``; False when ``guard`` names no pending guard."""
    path = state.dir / "guards" / f"{guard}.json"
    if not guard.isdigit() or not path.exists():
        return False
    path.unlink()
    return True


def ended(state: SimState) -> str | None:
    """The job's final state once its run ended not requeued (what a guard reads); None while it lives."""
    path = state.dir / "ended"
    return path.read_text().strip() or None if path.exists() else None


def fire(state: SimState, env: Mapping[str, str], code: int | None, out: IO[str]) -> bool:
    """The run ended, not requeued, with ``code``: a job that completed drops its guards; otherwise each runs, as
    Slurm starts it then. True when one of them requeued the job."""
    pending = sorted((state.dir / "guards").glob("*.json")) if (state.dir / "guards").exists() else []
    if not pending:
        return False
    (state.dir / "ended").write_text("COMPLETED" if code == 0 else "FAILED")
    try:
        for path in pending:
            guard = json.loads(path.read_text())
            path.rename(path.with_suffix(".done"))
            if code == 0:
                continue  # --kill-on-invalid-dep: its dependency can never be met
            print(f"slurmrt sim: guard job {guard['id']} starts (job {state.read_job()[0].job_id} ended FAILED)",
                  file=out, flush=True)
            try:
                done = subprocess.run(["bash", "-c", guard["command"]], env=dict(env), capture_output=True,
                                      text=True, check=False, timeout=TIMEOUT_S, start_new_session=True)
                said = done.stdout + done.stderr
            except subprocess.TimeoutExpired:
                said = f"guard job {guard['id']}: still running after {TIMEOUT_S:g} s, killed\n"
            out.write(said)
            out.flush()
    finally:
        (state.dir / "ended").unlink(missing_ok=True)
    return state.requested("requeue")


def after(record: RunRecord, state: SimState, env: Mapping[str, str], out: IO[str]) -> None:
    """A run ended as ``record`` says: unless it was requeued, its guards run (:func:`fire`); one that requeued the
    job says so in the record."""
    if not record.requeued and fire(state, env, record.exit_code, out):
        record.requeued, record.ended_by = True, f"{record.ended_by}; requeued by its guard job"
