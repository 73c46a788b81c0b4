"""The environment Slurm gives the batch shell and each task of an srun step, built purely from a JobSpec.

Shaped after a real srun step on Slurm 22.05 (docs/slurm.md): nodelists in compressed hostlist form,
tasks-per-node strings such as ``2(x2)``, ``SLURM_RESTART_COUNT`` only after a requeue, no ``SLURM_STEP_ID`` in the
batch shell, and no ``SLURM_JOB_END_TIME`` (22.05 does not set it: the end time comes from squeue).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from .._env import format_tasks_per_node
from ..launch import hostlist
from .spec import JobSpec

__all__ = ["StepLayout", "batch_env", "default_node_names", "task_env"]


def default_node_names(count: int) -> tuple[str, ...]:
    """``n1..nN`` when those names resolve to distinct local addresses (tests/slurm/cluster.sh writes them into
    /etc/hosts), else IP-shaped names ``127.0.1.K``, which are valid hostlist entries and resolve anywhere."""
    names = tuple(f"n{i}" for i in range(1, count + 1))
    try:
        addresses = {socket.gethostbyname(name) for name in names}
    except OSError:
        addresses = set()
    if len(addresses) == count and all(a.startswith("127.") for a in addresses):
        return names
    return tuple(f"127.0.1.{i}" for i in range(1, count + 1))


def _job_env(spec: JobSpec, restart: int, submit_dir: str) -> dict[str, str]:
    nodes = spec.node_names
    tasks = format_tasks_per_node([spec.ntasks_per_node] * spec.nodes)
    env = {
        "SLURM_CLUSTER_NAME": "sim",
        "SLURM_WORKING_CLUSTER": "sim:127.0.0.1:6817:9728:109",
        "SLURM_CPUS_ON_NODE": str(spec.ntasks_per_node),  # one CPU per task, as without --cpus-per-task
        "SLURM_JOB_CPUS_PER_NODE": tasks,
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_USER": _user(),
        "SLURM_NODE_ALIASES": "(null)",
        "SLURM_PRIO_PROCESS": str(os.getpriority(os.PRIO_PROCESS, 0)),
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_JOB_ID": str(spec.job_id),
        "SLURM_JOBID": str(spec.job_id),
        "SLURM_JOB_NAME": spec.job_name,
        "SLURM_JOB_PARTITION": "sim",
        "SLURM_JOB_NODELIST": hostlist.compress(nodes),
        "SLURM_NODELIST": hostlist.compress(nodes),
        "SLURM_JOB_NUM_NODES": str(spec.nodes),
        "SLURM_NNODES": str(spec.nodes),
        "SLURM_NTASKS": str(spec.ntasks),
        "SLURM_NPROCS": str(spec.ntasks),
        "SLURM_NTASKS_PER_NODE": str(spec.ntasks_per_node),
        "SLURM_TASKS_PER_NODE": tasks,
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_SUBMIT_HOST": socket.gethostname(),
    }
    if restart > 0:
        env["SLURM_RESTART_COUNT"] = str(restart)
    if spec.open_mode:
        env["SLURM_OPEN_MODE"] = spec.open_mode
    return env


def batch_env(spec: JobSpec, restart: int, submit_dir: str | None = None) -> dict[str, str]:
    """What the batch shell sees: the job's variables, rank 0 of node 0, and no step id."""
    env = _job_env(spec, restart, submit_dir or os.getcwd())
    env.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                "SLURMD_NODENAME": spec.node_names[0], "SLURM_TOPOLOGY_ADDR": spec.node_names[0],
                "SLURM_GTIDS": "0"})
    return env


@dataclass(frozen=True)
class StepLayout:
    """Where a step's tasks run: its nodes (a subset of the job's, in the job's order) and tasks on each."""

    nodes: tuple[str, ...]
    per_node: int

    @property
    def ntasks(self) -> int:
        return len(self.nodes) * self.per_node

    @classmethod
    def whole(cls, spec: JobSpec) -> StepLayout:
        return cls(spec.node_names, spec.ntasks_per_node)


def task_env(spec: JobSpec, restart: int, step: int, rank: int, submit_dir: str | None = None,
             layout: StepLayout | None = None) -> dict[str, str]:
    """What task ``rank`` of step ``step`` sees (block distribution: ranks fill the step's first node first). The
    step spans the whole allocation unless ``layout`` says otherwise; the job's variables stay the job's."""
    layout = layout or StepLayout.whole(spec)
    node, local = divmod(rank, layout.per_node)
    first = node * layout.per_node
    env = _job_env(spec, restart, submit_dir or os.getcwd())
    step_nodes = hostlist.compress(layout.nodes)
    tasks = format_tasks_per_node([layout.per_node] * len(layout.nodes))
    env.update({
        "SLURM_NODELIST": step_nodes,
        "SLURM_NNODES": str(len(layout.nodes)),
        "SLURM_NTASKS": str(layout.ntasks),
        "SLURM_NPROCS": str(layout.ntasks),
        "SLURM_NTASKS_PER_NODE": str(layout.per_node),
        "SLURM_TASKS_PER_NODE": tasks,
        "SLURM_STEP_ID": str(step),
        "SLURM_STEPID": str(step),
        "SLURM_STEP_NODELIST": step_nodes,
        "SLURM_STEP_NUM_NODES": str(len(layout.nodes)),
        "SLURM_STEP_NUM_TASKS": str(layout.ntasks),
        "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": layout.nodes[node],
        "SLURM_GTIDS": ",".join(str(first + i) for i in range(layout.per_node)),
        "SLURM_TOPOLOGY_ADDR": layout.nodes[node],
        "SLURM_DISTRIBUTION": "block",
        "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0": env["SLURM_JOB_CPUS_PER_NODE"],
        "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
        "SLURM_SRUN_COMM_HOST": "127.0.0.1",
        "SLURM_SRUN_COMM_PORT": str(40000 + step),
        "SLURM_STEP_LAUNCHER_PORT": str(40000 + step),
        "SLURM_UMASK": f"{_umask():04o}",
    })
    return env  # SLURM_TASK_PID is added by the srun shim, in the task itself


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
