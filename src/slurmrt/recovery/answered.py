"""What slurmrt in a step answered for its run, read after the step ended: the ``exit`` event its ranks recorded (the
code stands: it finished, stopped, requeued or refused), or srun's word that a task exited with
:attr:`~.policy.ExitCode.CONFIG` (``init()`` refused the launch before any event log existed). ``slurmrt run`` asks
before it judges a fault: an answer already given is not a fault to recover from.
"""

from __future__ import annotations

from pathlib import Path

from ..record.runs import Run
from . import injob
from .policy import ExitCode

__all__ = ["misconfigured_tasks", "recorded_code"]


def recorded_code(run: Run | None) -> int | None:
    """The exit code slurmrt in the step recorded for its run (the run's ``exit`` event), or None."""
    exit_event = run.exit if run is not None else None
    code = exit_event.get("code") if exit_event else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def misconfigured_tasks(directory: Path, attempt: int) -> list[int]:
    """The tasks of step ``attempt`` that srun saw exit with :attr:`ExitCode.CONFIG`: ``init()`` refused the launch
    or an option (its one line is in the output), and srun then ended the others. Every step would do the same."""
    said = f"Exited with exit code {int(ExitCode.CONFIG)}"
    return sorted(t for t, (_, how) in injob.read_ended(directory, attempt).items() if how == said)
