"""Who am I in this job: rank, node, world, master, derived purely from an environment mapping.

:func:`from_environ` reads; :meth:`Topology.exports` says what to write; only ``init()`` writes ``os.environ``.
Launch shapes (see docs/slurm.md for the variables measured in real steps):

``SRUN``
    ``srun`` started one task per process. Step variables win over job variables, because a step may run on fewer
    nodes than the job holds. ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` exported from Slurm's own values (Pyxis's
    PyTorch hook, or ``export RANK=$SLURM_PROCID`` in a script) are checked against Slurm and change nothing.
``LAUNCHER``
    torchrun or ``accelerate launch`` set ``RANK``/``WORLD_SIZE`` (usually one launcher per node under ``srun``);
    the launcher's values win and SLURM only checks the node layout.
``BATCH``
    The batch shell itself, without ``srun``: one process, whatever ``SLURM_NTASKS`` says.
``LOCAL``
    No SLURM and no launcher: rank 0 of 1, so the same script runs on a laptop.
"""

from __future__ import annotations

import enum
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from .._env import first_int, get_int, truthy
from .._errors import EnvironmentVariableError, LauncherConflictError, NodeRankError
from . import hostlist, slurmvars
from .launcher import rendezvous_backend
from .ports import master_port_for
from .slurmvars import Job, SlurmStep, allocation, check_below, job_of, required_int, slurm_step

__all__ = ["LaunchMode", "Topology", "from_environ"]

#: Set to 1 when torchrun uses an elastic (c10d/etcd) rendezvous, which assigns node ranks in join order.
ALLOW_NODE_RANK_REORDER = "SLURMRT_ALLOW_NODE_RANK_REORDER"


class LaunchMode(enum.Enum):
    SRUN = "srun"
    LAUNCHER = "launcher"
    BATCH = "batch"
    LOCAL = "local"


@dataclass(frozen=True)
class Topology:
    mode: LaunchMode
    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    hostname: str
    nodelist: tuple[str, ...] = ()
    #: The Slurm job (:func:`~.slurmvars.job_of`, read once, carried whole: its id, array task, restart count,
    #: cluster, placement); None outside Slurm.
    job: Job | None = None
    step_id: str | None = None
    #: In-job restarts before this step within this run of the job (``slurmrt run`` sets SLURMRT_RUN_ATTEMPT): 0 for
    #: the first step, 1 for the step that replaced it on a spare node, ...
    attempt: int = 0
    #: The allocation's node count (SLURM_JOB_NUM_NODES), which may exceed the step's.
    job_nnodes: int | None = None
    #: Things that are not errors but that the user should hear about (logged by init()).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_slurm(self) -> bool:
        return self.job is not None

    @property
    def job_id(self) -> str | None:
        return self.job.id if self.job is not None else None

    @property
    def array_job_id(self) -> str | None:
        return self.job.array_job if self.job is not None else None

    @property
    def array_task_id(self) -> str | None:
        return self.job.array_task if self.job is not None else None

    @property
    def restart_count(self) -> int:
        """Requeues of the job before this run (0 outside Slurm)."""
        return self.job.restart_count if self.job is not None else 0

    @property
    def cluster(self) -> str | None:
        """The cluster to ask about this job from another cluster sharing the filesystem."""
        return self.job.cluster if self.job is not None else None

    @property
    def requeue_id(self) -> str | None:
        """The id ``scontrol requeue`` needs: ``<array job>_<task>`` for an array task, the job id otherwise."""
        return self.job.requeue_id if self.job is not None else None

    def apply(self, environ: MutableMapping[str, str]) -> None:
        """Export :meth:`exports` into ``environ`` (``os.environ``): the one place slurmrt sets them. A launcher's
        value is never overwritten (they agree: slurmrt derived its own from it)."""
        for key, value in self.exports().items():
            environ.setdefault(key, value)

    def exports(self) -> dict[str, str]:
        """The variables ``torch.distributed.init_process_group("env://")`` reads."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def from_environ(env: Mapping[str, str], *, hostname: str | None = None,
                 launcher_argv: Sequence[str] | None = None) -> Topology:
    """Derive the topology of this process from ``env`` (``os.environ`` or a test's dict).

    ``launcher_argv`` is the command line of the launcher that started this process (torchrun, ``accelerate
    launch``), when known: it says whether the rendezvous orders the nodes itself (see :func:`rendezvous_backend`).
    """
    # Shape: a dispatch over the four launch modes, each built by its own function
    host = hostname or env.get("SLURMD_NODENAME") or socket.gethostname()
    job_id = slurmvars.job_id(env)
    in_step = job_id is not None and slurmvars.step_id(env) is not None
    launcher = "RANK" in env and "WORLD_SIZE" in env
    common = _common(env, job_id, host)

    if in_step:
        return _srun_step(env, common, launcher=launcher, launcher_argv=launcher_argv)
    if launcher:
        return _launcher(env, LaunchMode.LAUNCHER, common, nodelist=())
    if job_id is not None:
        return _batch_shell(env, job_id, common)
    port = _port(env, None, None) if env.get("MASTER_PORT") else 29500
    return _one_process(LaunchMode.LOCAL, env, port, common)


def _srun_step(env: Mapping[str, str], common: _Common, *, launcher: bool,
               launcher_argv: Sequence[str] | None) -> Topology:
    """A task of an srun step: srun's ranks, or a launcher's inside it (torchrun or ``accelerate launch``)."""
    slurm = slurm_step(env)
    if launcher and not _srun_is_the_launcher(env, slurm):
        return _launcher_under_srun(env, slurm, common, launcher_argv)
    rank, local_rank, node_rank, world, tasks, hosts = slurm
    return _build(LaunchMode.SRUN, env, common, rank=rank, local_rank=local_rank, node_rank=node_rank,
                  world=world, local_world=tasks[node_rank], nnodes=len(hosts), nodelist=tuple(hosts))


def _batch_shell(env: Mapping[str, str], job_id: str, common: _Common) -> Topology:
    """The batch script itself (no srun): one process, whatever the allocation's task count says."""
    procid = get_int(env, "SLURM_PROCID")
    if procid:
        raise EnvironmentVariableError(
            f"SLURM_PROCID={procid} without SLURM_STEP_ID: the batch shell always has SLURM_PROCID=0, and a task "
            "of an srun step always has SLURM_STEP_ID. Something exported SLURM_PROCID by hand, or removed "
            "SLURM_STEP_ID; launch the script with srun and leave the SLURM_* variables as Slurm sets them",
            variable="SLURM_PROCID",
            value=procid,
        )
    warnings: list[str] = []
    ntasks = get_int(env, "SLURM_NTASKS", minimum=1)
    get_int(env, "WORLD_SIZE", minimum=1)  # for `slurmrt env`, which exports from the batch shell
    allocation(env, ("SLURM_JOB_NODELIST", "SLURM_NODELIST"), ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
                ("SLURM_TASKS_PER_NODE",), ("SLURM_NTASKS", ntasks) if ntasks is not None else None)
    if ntasks is not None and ntasks > 1:
        warnings.append(
            f"running in the batch shell without srun, but SLURM_NTASKS={ntasks}: this is one process, and the "
            f"other {ntasks - 1} tasks will never start. Launch the script with `srun python train.py` "
            "(one task per GPU) or `srun torchrun ...` (one task per node)"
        )
    return _one_process(LaunchMode.BATCH, env, _port(env, job_id, "batch"), common, warnings=tuple(warnings))


def _one_process(mode: LaunchMode, env: Mapping[str, str], port: int, common: _Common,
                 warnings: tuple[str, ...] = ()) -> Topology:
    """The batch shell, or no Slurm at all: one process, rank 0 of 1."""
    return Topology(mode=mode, rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1, nnodes=1,
                    master_addr=env.get("MASTER_ADDR") or "127.0.0.1", master_port=port, warnings=warnings,
                    **common)


class _Common(TypedDict):
    """The Topology fields every launch shape fills the same way."""

    hostname: str
    job: Job | None
    step_id: str | None
    attempt: int
    job_nnodes: int | None


def _common(env: Mapping[str, str], job_id: str | None, host: str) -> _Common:
    """The fields of the job (:func:`~.slurmvars.job_of`, read once) that every rank's view carries."""
    job = job_of(env)
    job_nnodes = first_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", minimum=1)
    return {
        "hostname": host,
        "job": job,
        "step_id": slurmvars.step_id(env),
        "attempt": (get_int(env, "SLURMRT_RUN_ATTEMPT") or 0) if job_id is not None else 0,
        "job_nnodes": job_nnodes[1] if job_nnodes else None,
    }


def _port(env: Mapping[str, str], job_id: str | None, step_id: str | None) -> int:
    port = get_int(env, "MASTER_PORT", minimum=1)
    if port is not None:
        if port > 65535:
            raise EnvironmentVariableError(f"MASTER_PORT={port} is not a TCP port (1-65535)", variable="MASTER_PORT")
        return port
    return master_port_for(job_id, step_id)


def _launcher(env: Mapping[str, str], mode: LaunchMode, common: _Common, nodelist: tuple[str, ...]) -> Topology:
    rank = required_int(env, "RANK")
    world = required_int(env, "WORLD_SIZE", minimum=1)
    local_rank = get_int(env, "LOCAL_RANK") or 0
    local_world = get_int(env, "LOCAL_WORLD_SIZE", minimum=1) or world
    check_below(rank, "RANK", world, "WORLD_SIZE")
    check_below(local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
    if world % local_world:
        raise EnvironmentVariableError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}", variable="WORLD_SIZE"
        )
    node_rank = get_int(env, "GROUP_RANK")
    if node_rank is None:
        node_rank = rank // local_world
    nnodes = get_int(env, "GROUP_WORLD_SIZE", minimum=1) or world // local_world
    return _build(mode, env, common, rank=rank, local_rank=local_rank, node_rank=node_rank, world=world,
                  local_world=local_world, nnodes=nnodes, nodelist=nodelist)


def _build(mode: LaunchMode, env: Mapping[str, str], common: _Common, *, rank: int, local_rank: int, node_rank: int,
           world: int, local_world: int, nnodes: int, nodelist: tuple[str, ...]) -> Topology:
    """The one construction of a multi-process Topology: the master is ``MASTER_ADDR``, else the first node."""
    return Topology(mode=mode, rank=rank, local_rank=local_rank, node_rank=node_rank, world_size=world,
                    local_world_size=local_world, nnodes=nnodes,
                    master_addr=env.get("MASTER_ADDR") or (nodelist[0] if nodelist else "127.0.0.1"),
                    master_port=_port(env, job.id if (job := common["job"]) else None, common["step_id"]),
                    nodelist=nodelist, **common)


#: Variables that only an elastic agent (torchrun, and ``accelerate launch``, which runs torchrun's agent) sets in
#: its workers. Pyxis's PyTorch hook and hand-written ``export RANK=$SLURM_PROCID`` lines set none of them.
_ELASTIC_AGENT_VARS = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT", "ROLE_RANK")


def _srun_is_the_launcher(env: Mapping[str, str], slurm: SlurmStep) -> bool:
    """True when RANK/WORLD_SIZE merely restate srun's task layout: Pyxis's PyTorch hook exports ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` from ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_LOCALID`` in every task,
    and many sbatch scripts do the same by hand. Then the node layout comes from Slurm (those three variables do not
    carry it), and the exported values must agree with Slurm's."""
    # Shape: the rule's conditions in order, then one message naming every contradiction at once
    s_rank, s_local, s_node, s_world, s_tasks, _ = slurm
    if any(name in env for name in _ELASTIC_AGENT_VARS):
        return False
    world = required_int(env, "WORLD_SIZE", minimum=1)
    if world != s_world:
        return False
    stated = {"RANK": (get_int(env, "RANK"), s_rank, "SLURM_PROCID"),
              "LOCAL_RANK": (get_int(env, "LOCAL_RANK"), s_local, "SLURM_LOCALID"),
              "LOCAL_WORLD_SIZE": (get_int(env, "LOCAL_WORLD_SIZE"), s_tasks[s_node], "SLURM_STEP_TASKS_PER_NODE")}
    wrong = {name: v for name, v in stated.items() if v[0] is not None and v[0] != v[1]}
    if wrong:
        said = " and ".join(f"{name}={v[0]}" for name, v in wrong.items())
        truth = " and ".join(f"{v[2]}={v[1]}" for v in wrong.values())
        raise LauncherConflictError(
            f"{said} {'contradicts' if len(wrong) == 1 else 'contradict'} {truth} in a step of {s_world} tasks. "
            "A RANK exported in the batch shell is "
            "inherited by every task; remove that export (slurmrt derives RANK from SLURM_PROCID), or set it "
            "inside srun with bash -c 'RANK=$SLURM_PROCID ...'",
            rank=stated["RANK"][0],
            slurm_procid=s_rank,
        )
    return True


def _launcher_under_srun(env: Mapping[str, str], slurm: SlurmStep, common: _Common,
                         argv: Sequence[str] | None) -> Topology:
    s_rank, s_local, s_node, s_world, s_tasks, hosts = slurm
    topo = _launcher(env, LaunchMode.LAUNCHER, common, nodelist=tuple(hosts))
    if s_tasks[s_node] != 1:
        raise LauncherConflictError(
            f"srun started {s_tasks[s_node]} tasks on this node (SLURM_STEP_TASKS_PER_NODE) and each runs a launcher "
            f"with LOCAL_WORLD_SIZE={topo.local_world_size}: {s_tasks[s_node] * topo.local_world_size} processes "
            "for one node. With torchrun or accelerate launch inside srun, use `srun --ntasks-per-node=1`",
            slurm_tasks_per_node=s_tasks[s_node],
            local_world_size=topo.local_world_size,
        )
    if topo.nnodes != len(hosts):
        raise LauncherConflictError(
            f"the launcher runs on {topo.nnodes} nodes (WORLD_SIZE={topo.world_size} / "
            f"LOCAL_WORLD_SIZE={topo.local_world_size}) but the srun step spans {len(hosts)} "
            f"({hostlist.compress(hosts)}). Pass --nnodes=$SLURM_NNODES to torchrun (or --num_machines to accelerate)",
            launcher_nnodes=topo.nnodes,
            slurm_nnodes=len(hosts),
        )
    backend = rendezvous_backend(argv)
    # An elastic rendezvous (c10d, etcd) orders the nodes in the order they join and ignores --node_rank: a group
    # rank other than SLURM_NODEID is normal there. Only a static one takes --node_rank as the truth, and there an
    # early-expanded `--node_rank $SLURM_PROCID` (0 on every node) makes the rendezvous hang.
    elastic = backend is not None and backend != "static"
    if topo.node_rank != s_node and not elastic and not truthy(env.get(ALLOW_NODE_RANK_REORDER)):
        if argv is None:
            seen = ("slurmrt found no torchrun or accelerate launch among the parents of this process, so it "
                    "cannot tell whether the rendezvous orders the nodes itself (an elastic one, c10d, does; then "
                    f"set {ALLOW_NODE_RANK_REORDER}=1)")
        else:
            seen = (f"the launcher's rendezvous is {backend}, which takes the node rank as given (an elastic "
                    f"rendezvous, --rdzv_backend c10d, orders the nodes itself and is accepted; to accept this "
                    f"launch anyway, set {ALLOW_NODE_RANK_REORDER}=1)")
        raise NodeRankError(
            f"the launcher says node rank {topo.node_rank} but this is node {s_node} of the step "
            f"(SLURM_NODEID={s_node}, host {common['hostname']}). Usually `--node_rank=$SLURM_PROCID` or "
            "`--machine_rank=$SLURM_NODEID` was expanded by the batch shell, where it is 0, so every node claims "
            "rank 0 and the rendezvous hangs. Fix: wrap the launcher so the variable is expanded inside the step: "
            f"srun bash -c 'torchrun --node_rank=$SLURM_NODEID ...'. Here {seen}",
            launcher_node_rank=topo.node_rank,
            slurm_nodeid=s_node,
        )
    return topo
