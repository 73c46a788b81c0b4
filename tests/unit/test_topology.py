"""Launch shapes, with environments shaped like the ones measured in real srun steps (docs/slurm.md)."""

from __future__ import annotations

import pytest

from slurmrt import EnvironmentVariableError, LauncherConflictError, LaunchMode, NodeRankError
from slurmrt.launch.ports import PORT_BASE, PORT_SPAN, master_port_for
from slurmrt.launch.topology import from_environ


def srun_env(procid: int, *, ntasks: int = 4, nodes: str = "n[1-2]", nnodes: int = 2, tpn: str = "2(x2)",
             **extra: str) -> dict[str, str]:
    per_node = ntasks // nnodes
    env = {
        "SLURM_JOB_ID": "1234",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_STEP_TASKS_PER_NODE": tpn,
        "SLURM_TASKS_PER_NODE": tpn,
        "SLURMD_NODENAME": f"n{procid // per_node + 1}",
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("procid", range(4))
def test_srun_one_task_per_process_takes_ranks_from_slurm(procid: int) -> None:
    topo = from_environ(srun_env(procid))
    assert topo.mode is LaunchMode.SRUN
    assert (topo.rank, topo.local_rank, topo.node_rank) == (procid, procid % 2, procid // 2)
    assert (topo.world_size, topo.local_world_size, topo.nnodes) == (4, 2, 2)
    assert topo.master_addr == "n1"
    assert topo.exports()["RANK"] == str(procid)
    assert topo.exports()["MASTER_PORT"] == str(master_port_for("1234", "0"))


def test_step_variables_win_over_job_variables_when_the_step_uses_fewer_nodes() -> None:
    env = srun_env(1, ntasks=2, nodes="n[3-4]", nnodes=2, tpn="1(x2)")
    env.update({"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_NNODES": "4", "SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    topo = from_environ(env)
    assert (topo.world_size, topo.nnodes, topo.master_addr, topo.job_nnodes) == (2, 2, "n3", 4)


def test_uneven_tasks_per_node_give_each_node_its_own_local_world_size() -> None:
    env = srun_env(2, ntasks=3, tpn="2,1")
    env.update({"SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    assert from_environ(env).local_world_size == 1


def test_batch_shell_without_srun_is_one_process_whatever_slurm_ntasks_says() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8",
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2"}
    topo = from_environ(env)
    assert topo.mode is LaunchMode.BATCH
    assert (topo.rank, topo.world_size) == (0, 1)
    assert topo.warnings and "7 tasks will never start" in topo.warnings[0]


def test_no_slurm_and_no_launcher_is_a_single_local_process() -> None:
    topo = from_environ({})
    assert topo.mode is LaunchMode.LOCAL
    assert (topo.rank, topo.world_size, topo.master_addr) == (0, 1, "127.0.0.1")


def test_torchrun_on_a_workstation_keeps_the_launchers_values() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "ws", "MASTER_PORT": "29400"}
    topo = from_environ(env)
    assert topo.mode is LaunchMode.LAUNCHER
    assert (topo.rank, topo.local_rank, topo.node_rank, topo.nnodes, topo.master_port) == (3, 1, 1, 2, 29400)


def torchrun_under_srun(node: int, local: int, *, group_rank: int | None = None) -> dict[str, str]:
    env = srun_env(node, ntasks=2, tpn="1(x2)")
    env.update({"SLURM_LOCALID": "0", "SLURM_NODEID": str(node)})
    gr = node if group_rank is None else group_rank
    env.update({"RANK": str(gr * 4 + local), "LOCAL_RANK": str(local), "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": str(gr), "MASTER_ADDR": "n1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "1234"})
    return env


def test_torchrun_inside_srun_one_task_per_node_uses_the_launchers_ranks_and_slurms_nodes() -> None:
    topo = from_environ(torchrun_under_srun(1, 2))
    assert (topo.mode, topo.rank, topo.local_rank, topo.node_rank, topo.world_size) == (LaunchMode.LAUNCHER, 6, 2, 1,
                                                                                        8)
    assert topo.nodelist == ("n1", "n2")


def test_node_rank_from_an_early_interpolated_slurm_procid_is_refused() -> None:
    with pytest.raises(NodeRankError, match=r"node rank 0 but this is node 1 .*SLURM_NODEID=1.*srun bash -c"):
        from_environ(torchrun_under_srun(1, 0, group_rank=0))


def test_elastic_rendezvous_may_reorder_node_ranks_when_the_user_says_so() -> None:
    env = torchrun_under_srun(1, 0, group_rank=0)
    env["SLURMRT_ALLOW_NODE_RANK_REORDER"] = "1"
    assert from_environ(env).node_rank == 0


@pytest.mark.parametrize("procid", range(4))
def test_pyxis_pytorch_hook_in_a_step_of_one_task_per_gpu_keeps_slurms_node_layout(procid: int) -> None:
    """Pyxis exports RANK, WORLD_SIZE and LOCAL_RANK from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, nothing
    else (no LOCAL_WORLD_SIZE, no GROUP_RANK): the nodes must still come from Slurm."""
    env = srun_env(procid)
    env.update({"RANK": str(procid), "WORLD_SIZE": "4", "LOCAL_RANK": str(procid % 2)})
    topo = from_environ(env, launcher_argv=None)
    assert topo.mode is LaunchMode.SRUN
    assert (topo.rank, topo.local_rank, topo.node_rank) == (procid, procid % 2, procid // 2)
    assert (topo.world_size, topo.local_world_size, topo.nnodes) == (4, 2, 2)


def test_pyxis_shape_passes_the_nnodes_preflight_check() -> None:
    from slurmrt.launch import preflight
    from slurmrt.launch.parallel import ParallelConfig

    env = srun_env(3)
    env.update({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "NNODES": "2"})
    topo = from_environ(env)
    preflight.check(topo, ParallelConfig().with_environment(env), node_gpus=None)


@pytest.mark.parametrize("procid", range(4))
def test_hand_written_export_of_rank_and_world_size_alone_keeps_slurms_layout(procid: int) -> None:
    """`srun bash -c 'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS; python train.py'`: no LOCAL_RANK."""
    env = srun_env(procid)
    env.update({"RANK": str(procid), "WORLD_SIZE": "4"})
    topo = from_environ(env)
    assert (topo.mode, topo.local_rank, topo.node_rank, topo.local_world_size) == (LaunchMode.SRUN, procid % 2,
                                                                                   procid // 2, 2)


def test_a_local_rank_that_contradicts_slurm_localid_is_an_error() -> None:
    env = srun_env(3)
    env.update({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"})
    with pytest.raises(LauncherConflictError, match=r"LOCAL_RANK=3 contradicts SLURM_LOCALID=1"):
        from_environ(env)


C10D = ["python", "-m", "torch.distributed.run", "--nproc_per_node", "4", "--nnodes", "2", "--rdzv_endpoint",
        "n1:29500", "--rdzv_backend", "c10d", "--max_restarts", "0", "train.py"]
STATIC = ["python", "-m", "torch.distributed.run", "--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "0",
          "--master_addr", "n1", "--master_port", "29500", "train.py"]


@pytest.mark.parametrize(("argv", "backend"), [
    (C10D, "c10d"),
    (["torchrun", "--rdzv-backend=c10d", "x.py"], "c10d"),
    (["torchrun", "--rdzv_backend=etcd-v2", "x.py"], "etcd-v2"),
    (["torchrun", "--standalone", "--nproc-per-node", "2", "x.py"], "c10d"),
    (STATIC, "static"),
    (["accelerate", "launch", "--rdzv_backend", "c10d", "--machine_rank", "1", "x.py"], "c10d"),
    # The guide's Accelerate line: `rdzv_backend=c10d` inside --rdzv_conf is only a config key; the rendezvous
    # itself stays accelerate's default, static, which takes --machine_rank as the truth.
    (["accelerate", "launch", "--rdzv_conf", "rdzv_backend=c10d,rdzv_endpoint=n1:29500", "x.py"], "static"),
    (None, None),
])
def test_rendezvous_backend_is_read_off_the_launchers_command_line(argv: list[str] | None,
                                                                   backend: str | None) -> None:
    from slurmrt.launch.launcher import rendezvous_backend

    assert rendezvous_backend(argv) == backend


def test_c10d_rendezvous_may_order_nodes_unlike_slurm_nodeid() -> None:
    topo = from_environ(torchrun_under_srun(1, 0, group_rank=0), launcher_argv=C10D)
    assert (topo.node_rank, topo.rank) == (0, 0)


def test_static_rendezvous_with_an_early_expanded_node_rank_is_refused() -> None:
    with pytest.raises(NodeRankError, match=r"node rank 0 but this is node 1 .*srun bash -c"):
        from_environ(torchrun_under_srun(1, 0, group_rank=0), launcher_argv=STATIC)


def test_torchrun_with_one_process_per_node_and_c10d_is_not_mistaken_for_srun() -> None:
    env = srun_env(0, ntasks=2, tpn="1(x2)")
    env.update({"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "1", "MASTER_ADDR": "n2"})
    topo = from_environ(env, launcher_argv=C10D)
    assert (topo.mode, topo.rank, topo.node_rank) == (LaunchMode.LAUNCHER, 1, 1)


def test_batch_shell_with_a_procid_other_than_0_is_a_broken_launch() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8"}
    with pytest.raises(EnvironmentVariableError, match=r"SLURM_PROCID=3 without SLURM_STEP_ID"):
        from_environ(env)


@pytest.mark.parametrize("value", ["1_0", "\u0663", " 3", "+3", "3 "])
def test_integers_in_slurm_variables_are_ascii_digits_only(value: str) -> None:
    env = srun_env(0)
    env["SLURM_NTASKS"] = env["SLURM_STEP_NUM_TASKS"] = value
    with pytest.raises(EnvironmentVariableError, match="SLURM_STEP_NUM_TASKS"):
        from_environ(env)


def test_rank_exported_in_the_batch_shell_contradicting_slurm_procid_is_an_error() -> None:
    env = srun_env(2)
    env.update({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    with pytest.raises(LauncherConflictError, match=r"RANK=0 .* SLURM_PROCID=2"):
        from_environ(env)


def test_a_launcher_per_task_instead_of_per_node_is_an_error() -> None:
    env = srun_env(0)
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(LauncherConflictError, match="--ntasks-per-node=1"):
        from_environ(env)


def test_launcher_node_count_must_match_the_step() -> None:
    env = torchrun_under_srun(0, 0)
    env.update({"WORLD_SIZE": "12", "RANK": "0"})
    with pytest.raises(LauncherConflictError, match="3 nodes .* spans 2"):
        from_environ(env)


@pytest.mark.parametrize(("var", "value", "message"), [
    ("SLURM_PROCID", "one", "SLURM_PROCID='one' is not an integer"),
    ("SLURM_PROCID", "4", "SLURM_PROCID=4 is out of range"),
    ("SLURM_STEP_NODELIST", "n[2-1]", "SLURM_STEP_NODELIST='n\\[2-1\\]' cannot be parsed"),
    ("SLURM_STEP_TASKS_PER_NODE", "2(x3)", "describes 3 nodes"),
    ("SLURM_STEP_TASKS_PER_NODE", "two", "is not a Slurm tasks-per-node list"),
    ("SLURM_STEP_NUM_NODES", "3", "names 2 hosts"),
    ("MASTER_PORT", "70000", "not a TCP port"),
])
def test_malformed_slurm_variables_are_named_in_the_error(var: str, value: str, message: str) -> None:
    env = srun_env(0)
    env[var] = value
    with pytest.raises(EnvironmentVariableError, match=message):
        from_environ(env)


def test_array_tasks_requeue_under_their_array_id() -> None:
    env = srun_env(0, SLURM_ARRAY_JOB_ID="900", SLURM_ARRAY_TASK_ID="3", SLURM_RESTART_COUNT="2")
    topo = from_environ(env)
    assert topo.requeue_id == "900_3"
    assert topo.restart_count == 2


def test_master_port_differs_for_neighbouring_jobs_and_concurrent_steps() -> None:
    ports = {master_port_for(str(job), str(step)) for job in range(100_000, 105_000) for step in range(4)}
    assert len(ports) == 20_000
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)


def test_master_port_from_the_environment_wins() -> None:
    assert from_environ(srun_env(0, MASTER_PORT="12345")).master_port == 12345
