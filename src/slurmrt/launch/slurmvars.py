"""Slurm's own variables for a step and its allocation, read and checked: the ranks srun gave, the world, the hosts and
the tasks on each. Slurm sets them together: a value that disagrees with the others was exported by hand, and is
refused with the variable, the rule and the fix before any rendezvous. :mod:`.topology` builds the process's place
in the job from them.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._env import first_int, first_str, get_int, parse_tasks_per_node
from .._errors import EnvironmentVariableError, HostlistError
from . import hostlist

__all__ = ["SlurmStep", "allocation", "check_below", "required_int", "required_first", "slurm_step"]


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
    list_var, nodelist = first_str(env, *lists) or (lists[0], "")
    try:
        hosts = hostlist.expand(nodelist)
    except HostlistError as err:
        raise EnvironmentVariableError(f"{list_var}={nodelist!r} cannot be parsed: {err}", variable=list_var) from err
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
