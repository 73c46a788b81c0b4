"""A lease's record, read back: who holds the checkpoint directory (:class:`Holder`: the job, the host and pid of its
rank 0, its heartbeat), parsed strictly (a damaged or hand-written lease is no holder), and what Slurm says of the
holder's job. :mod:`.lease` decides from them whether the lease is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _figures, _slurm

__all__ = ["Holder", "slurm_job_alive"]

#: Two hosts' clocks may differ by this much before a heartbeat "in the future" is worth saying.
_AHEAD_S = 60.0
#: squeue states of a job that still has, or will again have, processes.
_LIVE_STATES = {"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}


@dataclass(frozen=True)
class Holder:
    owner: str  #: the job's requeue id, or a local run's token
    host: str
    pid: int
    start: int | None  #: the pid's start time (/proc), which tells a reused pid from the holder
    heartbeat: float  #: wall time of the last refresh
    job: str | None = None
    array_task: str | None = None
    uid: int | None = None
    cluster: str | None = None  #: SLURM_CLUSTER_NAME where the holder runs: the cluster to ask about its job
    step: str | None = None  #: its Slurm step (SLURM_STEP_ID)
    run: str | None = None  #: its run of the job: "<restart>.<in-job attempt>"

    @classmethod
    def parse(cls, data: Any) -> Holder | None:
        """The holder written in a lease file; None when it is not one (damaged: treated as no lease, with a
        warning by the caller)."""
        if not isinstance(data, dict):
            return None
        try:
            holder = cls(owner=str(data["owner"]), host=str(data["host"]), pid=int(data["pid"]),
                         start=None if data.get("start") is None else int(data["start"]),
                         heartbeat=_heartbeat(data["heartbeat"]), job=data.get("job"),
                         array_task=data.get("array_task"),
                         uid=data.get("uid"), cluster=_text_or_none(data.get("cluster")),
                         step=_text_or_none(data.get("step")), run=_text_or_none(data.get("run")))
        except (KeyError, TypeError, ValueError):
            return None
        return holder if holder.owner else None

    def describe(self, now: float) -> str:
        where = f"on {self.host}, pid {self.pid}"
        job = (f"job {self.owner}" + (f" (step {self.step})" if self.step else "")) if self.job else f"run {self.owner}"
        ahead = self.heartbeat - now
        if ahead > _AHEAD_S:  # a live holder cannot be told from a lease written with a wrong clock, or by hand
            return (f"{job} ({where}, heartbeat {ahead:.0f} s in the future: its host's clock is ahead of this one's, "
                    "or the lease was not written by slurmrt; it holds until that time has passed)")
        return f"{job} ({where}, heartbeat {max(0.0, -ahead):.0f} s ago)"


def _heartbeat(value: Any) -> float:
    """A heartbeat is a wall time within the figures' bounds; anything else makes the lease damaged."""
    heartbeat = _figures.epoch(value)
    if heartbeat is None:
        raise ValueError(f"heartbeat {value!r} is not a time")
    return heartbeat


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def slurm_job_alive(job: str, cluster: str | None = None) -> bool | None:
    """True while Slurm knows ``job`` as not ended, False when it says it ended or knows it no more, None when it
    cannot be asked (no squeue, no answer, a cluster it cannot reach). ``cluster``: the holder's own cluster
    (``squeue -M``), so that another cluster sharing the filesystem is never the one asked."""
    where = ("-M", cluster) if cluster else ()
    out = _slurm.run("squeue", *where, "-h", "-j", job, "-o", "%T", timeout_s=20.0)
    if isinstance(out, str):
        return None
    if out.returncode != 0:
        return False if "Invalid job id" in out.stderr else None
    states = {line.strip().upper() for line in out.stdout.splitlines()
              if line.strip() and not line.startswith("CLUSTER:")}
    return bool(states & _LIVE_STATES)
