"""Slurm's own variables, read and checked: the job (:class:`Job`: its ids, nodes, tasks per node, restart count,
partition, account, QOS and cluster), an srun step (the ranks srun gave, the world, the hosts and the tasks on
each), and the single values the other parts need (the node's name, the submit directory, the job's start and end
time, ...). Slurm sets them together: a value that disagrees with the others was exported by hand, and is refused with
the variable, the rule and the fix before any rendezvous. :mod:`.topology` builds the process's place in the job from
them; ``slurmrt run``, ``slurmrt env`` and the guard job read the job through :func:`job_of`.

Slurm's variable names are spelled here and in :mod:`.topology` (and by the simulator, which sets them), nowhere else
in the package: a part that needs a value asks for it by meaning (tests/unit/test_layout.py holds that).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .._env import first_int, first_str, get_int, parse_tasks_per_node
from .._errors import EnvironmentVariableError, HostlistError
from . import hostlist

__all__ = ["Job", "SlurmStep", "allocation", "check_below", "cluster_name", "end_time", "export_env", "gpus_on_node",
           "job_id", "job_nodes", "job_of", "launch_key", "local_id", "node_name", "ntasks", "proc_id",
           "required_first", "required_int", "slurm_step", "start_time", "step_id", "submit_dir", "this_node"]


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


def job_of(env: Mapping[str, str], *, default_id: str | None = None) -> Job | None:
    """The job of ``env``; None outside a Slurm job (no ``SLURM_JOB_ID``, and no ``default_id``: the job a caller
    knows from elsewhere, as the guard's arming does). A malformed value (a node list that is no hostlist, a restart
    count or task count that is no number) raises :class:`EnvironmentVariableError`."""
    the_id = job_id(env) or default_id
    if not the_id:
        return None
    _, _, nodes = _hosts(env, ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    text = {name: env.get(f"SLURM_{name}") or None for name in ("ARRAY_JOB_ID", "ARRAY_TASK_ID", "JOB_PARTITION",
                                                               "JOB_ACCOUNT", "JOB_QOS", "CLUSTER_NAME")}
    return Job(the_id, tuple(nodes), _tasks_per_node(env), get_int(env, "SLURM_RESTART_COUNT") or 0,
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


# The single values, each by its meaning. Text comes back as Slurm wrote it (None when unset or empty); a number that
# is malformed raises EnvironmentVariableError (a ValueError) with the variable's name.

def job_id(env: Mapping[str, str]) -> str | None:
    """The job's id (``SLURM_JOB_ID``, or older Slurm's ``SLURM_JOBID``); None outside a job."""
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


def step_id(env: Mapping[str, str]) -> str | None:
    """This srun step's id (``SLURM_STEP_ID``, or older Slurm's ``SLURM_STEPID``); None in the batch shell."""
    return env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or None


def node_name(env: Mapping[str, str]) -> str | None:
    """The node as Slurm names it (``SLURMD_NODENAME``); None outside a job's step or batch shell."""
    return env.get("SLURMD_NODENAME") or None


def this_node(env: Mapping[str, str]) -> str:
    """The node as Slurm names it, else this host's short name (what Slurm's node names usually are)."""
    return node_name(env) or socket.gethostname().split(".")[0]


def submit_dir(env: Mapping[str, str]) -> str | None:
    """Where the job was submitted (``SLURM_SUBMIT_DIR``): every node sees it, and sbatch writes the output there."""
    return env.get("SLURM_SUBMIT_DIR") or None


def proc_id(env: Mapping[str, str]) -> str | None:
    """This task's rank in its srun step (``SLURM_PROCID``), as written: a log prefix shows it unchecked."""
    return env.get("SLURM_PROCID") or None


def local_id(env: Mapping[str, str]) -> str | None:
    """This task's rank on its node in its srun step (``SLURM_LOCALID``), as written."""
    return env.get("SLURM_LOCALID") or None


def cluster_name(env: Mapping[str, str]) -> str | None:
    """``SLURM_CLUSTER_NAME``: the cluster to ask about this job from another one sharing the filesystem."""
    return env.get("SLURM_CLUSTER_NAME") or None


def export_env(env: Mapping[str, str]) -> str:
    """What sbatch's ``--export`` was (``SLURM_EXPORT_ENV``), stripped; empty when unset."""
    return env.get("SLURM_EXPORT_ENV", "").strip()


def launch_key(env: Mapping[str, str]) -> tuple[str, str, str]:
    """(job, step, restart count) as written, empty when unset: the same for every task of one launch of a step."""
    return (job_id(env) or "", step_id(env) or "", env.get("SLURM_RESTART_COUNT", ""))


def job_nodes(env: Mapping[str, str]) -> int | None:
    """The allocation's node count, spares included (``SLURM_JOB_NUM_NODES``); None when unset."""
    return get_int(env, "SLURM_JOB_NUM_NODES", minimum=1)


def ntasks(env: Mapping[str, str]) -> int | None:
    """The job's task count (``SLURM_NTASKS``); None when unset."""
    return get_int(env, "SLURM_NTASKS", minimum=1)


def gpus_on_node(env: Mapping[str, str]) -> int | None:
    """The GPUs the job was given on this node (``SLURM_GPUS_ON_NODE``); None when unset or not a count (a node
    without GRES, a container that cleared it): the callers fall back to what the node shows."""
    raw = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(raw) if raw.isdigit() else None


def start_time(env: Mapping[str, str]) -> float | None:
    """When Slurm started this run of the job (``SLURM_JOB_START_TIME``, epoch seconds, Slurm 23.02 and newer); None
    when absent or 0."""
    value = get_int(env, "SLURM_JOB_START_TIME", minimum=0)
    return float(value) if value else None


def end_time(env: Mapping[str, str]) -> float | None:
    """The job's end time (``SLURM_JOB_END_TIME``, epoch seconds, Slurm 23.02 and newer); None when absent or 0 (no
    limit). A malformed value is an error, not "no deadline": ignoring it silently turned the deadline off."""
    value = get_int(env, "SLURM_JOB_END_TIME", minimum=0)
    return float(value) if value else None
