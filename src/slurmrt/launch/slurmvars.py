"""Slurm's own variables, read and checked: the job (:class:`Job`: its ids, nodes, tasks per node, restart count,
partition, account, QOS and cluster) and an srun step (the ranks srun gave, the world, the hosts and the tasks on
each). Slurm sets them together: a value that disagrees with the others was exported by hand, and is refused with the
variable, the rule and the fix before any rendezvous. :mod:`.topology` builds the process's place in the job from
them; ``slurmrt run``, ``slurmrt env`` and the guard job read the job through :func:`job_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._env import first_int, first_str, get_int, parse_tasks_per_node
from .._errors import EnvironmentVariableError, HostlistError
from . import hostlist

__all__ = ["Job", "SlurmStep", "allocation", "check_below", "job_of", "required_int", "required_first", "slurm_step"]


@dataclass(frozen=True)
class Job:
    """The Slurm job of this process, as its variables describe it (read once, by :func:`job_of`)."""

    id: str
    #: The job's nodes (``SLURM_JOB_NODELIST``), in Slurm's order; empty where Slurm gave none.
    nodes: tuple[str, ...] = ()
    #: Tasks per node as the job asked (``--ntasks-per-node``, or the first count of ``SLURM_TASKS_PER_NODE``).
    tasks_per_node: int = 1
    restart_count: int = 0
    array_job: str | None = None
    array_task: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    #: ``SLURM_CLUSTER_NAME``: the cluster to ask about this job from another one sharing the filesystem.
    cluster: str | None = None

    @property
    def requeue_id(self) -> str:
        """The id to requeue, and the event log's: ``ARRAY_TASK`` for a task of a job array."""
        return f"{self.array_job}_{self.array_task}" if self.array_job and self.array_task else self.id

    def placement_options(self) -> list[str]:
        """sbatch options that put another job where this one runs (its partition, account and QOS)."""
        return [f"--{flag}={value}" for flag, value in (("partition", self.partition), ("account", self.account),
                                                          ("qos", self.qos)) if value]


def job_of(env: Mapping[str, str]) -> Job | None:
    """The job of ``env``; None outside a Slurm job (no ``SLURM_JOB_ID``). A malformed value (a node list that is no
    hostlist, a restart count or task count that is no number) raises :class:`EnvironmentVariableError`."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")  # the second: older Slurm's name
    if not job_id:
        return None
    _, _, nodes = _hosts(env, ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    text = {name: env.get(f"SLURM_{name}") or None for name in ("ARRAY_JOB_ID", "ARRAY_TASK_ID", "JOB_PARTITION",
                                                               "JOB_ACCOUNT", "JOB_QOS", "CLUSTER_NAME")}
    return Job(job_id, tuple(nodes), _tasks_per_node(env), get_int(env, "SLURM_RESTART_COUNT") or 0,
               text["ARRAY_JOB_ID"], text["ARRAY_TASK_ID"], text["JOB_PARTITION"], text["JOB_ACCOUNT"],
               text["JOB_QOS"], text["CLUSTER_NAME"])


def _hosts(env: Mapping[str, str], lists: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """(the variable, its value, the hosts) of the first of ``lists`` that is set; a value that is no hostlist is
    refused with its name."""
    list_var, nodelist = first_str(env, *lists) or (lists[0], "")
    try:
        return list_var, nodelist, hostlist.expand(nodelist) if nodelist else []
    except HostlistError as err:
        raise EnvironmentVariableError(f"{list_var}={nodelist!r} cannot be parsed: {err}", variable=list_var) from err


def _tasks_per_node(env: Mapping[str, str]) -> int:
    asked = get_int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
    if asked is not None:
        return asked
    raw = env.get("SLURM_TASKS_PER_NODE")
    return parse_tasks_per_node("SLURM_TASKS_PER_NODE", raw)[0] if raw else 1


SlurmStep = tuple[int, int, int, int, list[int], list[str]]


def slurm_step(env: Mapping[str, str]) -> SlurmStep:
    """(rank, local rank, node rank, world size, tasks per node, hosts) of an srun step, validated."""
    rank = required_int(env, "SLURM_PROCID")
    local_rank = required_int(env, "SLURM_LOCALID")
    node_rank = required_int(env, "SLURM_NODEID")
    world_var, world = required_first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    hosts, counted = allocation(env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
                                 ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
                                 ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), (world_var, world))
    if not hosts:
        raise EnvironmentVariableError(
            "SLURM_STEP_NODELIST is empty or missing inside an srun step; Slurm always sets it",
            variable="SLURM_STEP_NODELIST")
    if counted is not None:
        tasks = counted
    else:
        if world % len(hosts):
            raise EnvironmentVariableError(
                f"{world_var}={world} tasks cannot be spread evenly on {len(hosts)} nodes and "
                "SLURM_STEP_TASKS_PER_NODE is missing",
                variable=world_var,
            )
        tasks = [world // len(hosts)] * len(hosts)
    check_below(rank, "SLURM_PROCID", world, world_var)
    check_below(node_rank, "SLURM_NODEID", len(hosts), "the step's node count")
    check_below(local_rank, "SLURM_LOCALID", tasks[node_rank], f"the tasks on node {node_rank}")
    return rank, local_rank, node_rank, world, tasks, hosts


def allocation(env: Mapping[str, str], lists: tuple[str, ...], counts: tuple[str, ...], per_node: tuple[str, ...],
                world: tuple[str, int] | None) -> tuple[list[str], list[int] | None]:
    """The hosts (from the first of ``lists`` that is set) and the tasks on each (from ``per_node``; None when
    unset), checked against the node count (``counts``) and the task count ``world`` (its variable and value).
    Slurm sets them together: a disagreement is a value exported by hand, refused before any rendezvous."""
    list_var, nodelist, hosts = _hosts(env, lists)
    nodes = first_int(env, *counts, minimum=1)
    if hosts and nodes is not None and nodes[1] != len(hosts):
        raise EnvironmentVariableError(
            f"{nodes[0]}={nodes[1]} but {list_var}={nodelist!r} names {len(hosts)} hosts; the two must agree",
            variable=nodes[0],
        )
    tpn_var, tpn_raw = first_str(env, *per_node) or ("", "")
    if not tpn_raw or not hosts:
        return hosts, None
    tasks = parse_tasks_per_node(tpn_var, tpn_raw)
    if len(tasks) != len(hosts):
        raise EnvironmentVariableError(
            f"{tpn_var}={tpn_raw!r} describes {len(tasks)} nodes but {list_var}={nodelist!r} names {len(hosts)}",
            variable=tpn_var,
        )
    if world is not None and sum(tasks) != world[1]:
        raise EnvironmentVariableError(
            f"{tpn_var}={tpn_raw!r} adds up to {sum(tasks)} tasks but {world[0]}={world[1]}; Slurm sets both "
            "together: unset the one exported by hand", variable=tpn_var
        )
    return hosts, tasks


def required_int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = get_int(env, name, minimum=minimum)
    if value is None:
        raise EnvironmentVariableError(f"{name} is missing; it is required in this launch shape", variable=name)
    return value


def required_first(env: Mapping[str, str], *names: str) -> tuple[str, int]:
    found = first_int(env, *names, minimum=1)
    if found is None:
        raise EnvironmentVariableError(f"none of {', '.join(names)} is set inside an srun step", variable=names[0])
    return found


def check_below(value: int, name: str, limit: int, limit_name: str) -> None:
    if value >= limit:
        raise EnvironmentVariableError(
            f"{name}={value} is out of range: it must be below {limit_name} ({limit})", variable=name, value=value
        )
