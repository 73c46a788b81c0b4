"""The job's topology as attributes of the :class:`~slurmrt.Runtime` (``rt.rank``, ``rt.world_size``, ...)."""

from __future__ import annotations

from ..launch.topology import Topology

__all__ = ["TopologyView"]


class TopologyView:
    """Read-only attributes over ``self.topology``."""

    topology: Topology

    rank = property(lambda self: self.topology.rank)
    local_rank = property(lambda self: self.topology.local_rank)
    node_rank = property(lambda self: self.topology.node_rank)
    world_size = property(lambda self: self.topology.world_size)
    local_world_size = property(lambda self: self.topology.local_world_size)
    nnodes = property(lambda self: self.topology.nnodes)
    master_addr = property(lambda self: self.topology.master_addr)
    master_port = property(lambda self: self.topology.master_port)
    job_id = property(lambda self: self.topology.job_id)
    restart_count = property(lambda self: self.topology.restart_count)
    #: In-job restarts before this step in this run of the job (``slurmrt run``): 0 for the run's first step.
    in_job_restarts = property(lambda self: self.topology.attempt)

    def __repr__(self) -> str:
        t = self.topology
        return (f"Runtime(mode={t.mode.value}, rank={t.rank}/{t.world_size}, local_rank={t.local_rank}/"
                f"{t.local_world_size}, node={t.node_rank}/{t.nnodes}, master={t.master_addr}:{t.master_port}, "
                f"job={t.job_id}, restart={t.restart_count})")
