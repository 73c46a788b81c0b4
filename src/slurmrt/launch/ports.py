"""The rendezvous port of a job step, when ``MASTER_PORT`` does not say it: distinct for close job ids and for a
job's concurrent steps."""

from __future__ import annotations

__all__ = ["PORT_BASE", "PORT_SPAN", "STEP_SLOTS", "master_port_for"]

#: Ports are drawn below Linux's default ephemeral range (32768-60999), where an outgoing connection of any other
#: program may already hold the port we would pick.
PORT_BASE = 10000
PORT_SPAN = 22768
#: Concurrent steps of one job that get distinct ports; job ids that differ by less than PORT_SPAN // STEP_SLOTS
#: (5692 jobs) never collide, and jobs sharing a node at the same time have close ids.
STEP_SLOTS = 4


def master_port_for(job_id: str | None, step_id: str | None) -> int:
    """A port for this job step: distinct for close job ids and for a job's concurrent steps.

    Not a hash: a hash collides for a random pair with probability 1/PORT_SPAN, neighbours included, while this
    mapping keeps every job within 5692 ids of another apart. ``MASTER_PORT`` in the environment always wins.
    """
    job = _numeric(job_id)
    step = _numeric(step_id)
    return PORT_BASE + (job * STEP_SLOTS + step % STEP_SLOTS) % PORT_SPAN


def _numeric(value: str | None) -> int:
    if value is None:
        return 0
    digits = "".join(c for c in value if c.isdigit())
    return int(digits) if digits else 0
