"""What recovery needs to know about the job, resolved once: at ``init()`` for the ranks, by ``slurmrt run`` for its
steps. :func:`slurmrt.recovery.plan.plan` decides from these values alone; nothing in recovery reads the environment
after this.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..launch.topology import Topology
from .settings import RecoverySection

__all__ = ["ATTEMPT_ENV", "DIR_ENV", "Facts", "InJob", "InProcessFacts", "Raised", "Spares", "in_job_from_environ",
           "resolve"]

logger = logging.getLogger(__name__)

#: The recovery options a training tells ``slurmrt run`` (:meth:`Facts.learned`): the section's, whole.
POLICY = tuple(f.name for f in dataclasses.fields(RecoverySection))

#: Set by ``slurmrt run`` in the training step's environment (:mod:`slurmrt.recovery.supervisor`).
DIR_ENV = "SLURMRT_RUN_DIR"
ATTEMPT_ENV = "SLURMRT_RUN_ATTEMPT"


@dataclass(frozen=True)
class Spares:
    """What only ``slurmrt run`` weighs, the one planner of a new step: the spare nodes still in the job and its
    limit."""

    nodes: tuple[str, ...]
    #: ``slurmrt run --max-in-job-restarts``
    max_in_job_restarts: int


@dataclass(frozen=True)
class InJob:
    """A step of ``slurmrt run``: where to leave a request, which attempt this is. ``spares``: ``slurmrt run``'s own
    (:class:`Spares`); None in the training, which reports a fault there and exits, and lets ``slurmrt run`` decide
    between a new step and the requeue (no spare count travels down to the training and back up)."""

    directory: Path
    attempt: int
    spares: Spares | None = None


@dataclass(frozen=True)
class Raised:
    """The first error of a generation under ``slurmrt.run_restartable``, as the rank that raised it posted it: what
    the plan weighs of it."""

    kind: str  #: the exception's type
    #: the last step of the generation that raised it (before its first: the step it resumed after; None: none)
    step: int | None
    #: a :class:`~slurmrt.ConfigError`: an option or the launch is wrong, and every generation would meet it again
    misconfigured: bool = False
    #: a :class:`~slurmrt.TrainingHealthError`: the health check's ladder says re-run, rewind or end (``refused``),
    #: not the rule that the same error at the same step repeats (a re-run of that step is the ladder's first rung)
    unhealthy: bool = False
    #: why the health check's ladder ends the run (a reproducible fault with no rewind left)
    refused: str | None = None

    @property
    def signature(self) -> tuple[str, int | None]:
        """What makes an error the same as an earlier one: its type at the same step, whichever rank raised it."""
        return self.kind, self.step


@dataclass(frozen=True)
class InProcessFacts:
    """What ``slurmrt.run_restartable`` knows of this run's restarts in the process."""

    #: ``run_restartable(..., max_in_process_restarts=)``
    max_in_process_restarts: int
    #: The errors earlier generations were restarted after, in order.
    restarted: tuple[Raised, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Facts:
    """Everything :func:`~slurmrt.recovery.plan.plan` weighs besides the trigger itself."""

    #: The id ``scontrol requeue`` takes (``ARRAY_TASK`` for a task of an array); None: not a Slurm job.
    job: str | None = None
    #: The recovery's options, whole: ``requeue``, ``max_restarts``, ``max_futile_runs``, ``max_excluded_nodes``.
    policy: RecoverySection = RecoverySection()
    #: ``SLURM_RESTART_COUNT``: requeues before this run.
    restart_count: int = 0
    #: Runs (or in-job steps) in a row, this one included, that committed no checkpoint newer than the one they
    #: resumed from. Only the rank that acts knows it, from the event log, when it acts (:meth:`with_futile`); 0
    #: before that, so that every rank asking "could a restart happen?" gets the same answer.
    futile: int = 0
    #: Set under ``slurmrt run``: an in-job restart is possible in principle.
    in_job: InJob | None = None
    #: The kill switch's path, for the words of a kill-switch stop.
    kill_switch: Path | None = None
    #: The nodes the job was allocated (``slurmrt run``, the guard): a --no-kill job that lost nodes shows fewer in
    #: ``scontrol show job``, but its requeue asks for them all again.
    job_nodes: int | None = None
    #: Set under ``slurmrt.run_restartable``, when a rank raised: a restart in the process is possible in principle.
    in_process: InProcessFacts | None = None


    def learned(self, data: Mapping[str, Any], event_log: Path | None) -> tuple[Facts, str]:
        """These facts with the options a training resolved (:func:`slurmrt.recovery.injob.read_facts`), and the
        differences from these and from ``event_log`` (the environment's), in words ("" when none). An event log the
        environment left unset is no difference: the training set its checkpoint directory in code, as the README's
        script does, and ``slurmrt run`` follows it."""
        new = dataclasses.replace(self, policy=RecoverySection(**{f: data[f] for f in POLICY}))
        learned_log = Path(data["event_log"]) if data["event_log"] else None
        differ = [f"{name}={getattr(new.policy, name)!r}" for name in POLICY
                  if getattr(new.policy, name) != getattr(self.policy, name)]
        if event_log is not None and learned_log != Path(os.path.abspath(event_log)):  # it is absolute
            differ.append(f"event log {learned_log}")
        return new, ", ".join(differ)

    def with_futile(self, futile: int) -> Facts:
        return dataclasses.replace(self, futile=futile)

    def without_in_job(self) -> Facts:
        """The same facts with no supervisor to ask: what is left when a request cannot be left for it."""
        return dataclasses.replace(self, in_job=None)


def in_job_from_environ(env: Mapping[str, str]) -> InJob | None:
    """The supervisor's settings, or None without one. Values that ``slurmrt run`` would never write are reported
    and ignored: the step then fails over to the requeue, which loses nothing."""
    raw = env.get(DIR_ENV)
    if not raw:
        return None
    try:
        attempt = int(env.get(ATTEMPT_ENV, "0"))
        if attempt < 0 or not os.path.isabs(raw):
            raise ValueError
    except ValueError:
        logger.warning("%s=%r, %s=%r: not what `slurmrt run` sets; no in-job restart", DIR_ENV, raw,
                       ATTEMPT_ENV, env.get(ATTEMPT_ENV))
        return None
    return InJob(Path(raw), attempt)


def resolve(policy: RecoverySection, topology: Topology, env: Mapping[str, str], *,
            kill_switch: Path | None) -> Facts:
    """The facts of this run of the job, from its recovery options, its topology and ``slurmrt run``'s variables."""
    slurm = topology.is_slurm
    return Facts(job=topology.requeue_id if slurm else None, policy=policy, restart_count=topology.restart_count,
                 in_job=in_job_from_environ(env) if slurm else None, kill_switch=kill_switch)
