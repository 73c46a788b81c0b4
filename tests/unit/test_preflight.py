from __future__ import annotations

import pytest

from slurmrt import GpuCountError, NodeCountError, ParallelismError
from slurmrt.launch.parallel import ParallelConfig
from slurmrt.launch.preflight import check
from slurmrt.launch.topology import from_environ

from .test_topology import srun_env


def test_declared_nnodes_different_from_the_allocation_fails_naming_both() -> None:
    topo = from_environ(srun_env(0))
    with pytest.raises(NodeCountError, match=r"NNODES=4 but this step runs on 2 nodes \(n\[1-2\]\).*--nodes"):
        check(topo, ParallelConfig(nnodes=4), node_gpus=None)


def test_a_fix_is_never_the_setting_that_caused_the_mismatch() -> None:
    # NNODES=$SLURM_NNODES in the batch script of a job whose step trains on fewer nodes (slurmrt run's spares)
    topo = from_environ({**srun_env(0), "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]"})
    with pytest.raises(NodeCountError) as caught:
        check(topo, ParallelConfig(nnodes=3), node_gpus=None)
    assert "NNODES=$((SLURM_NNODES - 1))" in str(caught.value) and "NNODES=$SLURM_NNODES" not in str(caught.value)
    with pytest.raises(NodeCountError, match=r"NNODES=\$SLURM_NNODES"):  # the allocation's count is the fix here
        check(from_environ(srun_env(0)), ParallelConfig(nnodes=4), node_gpus=None)


def test_nnodes_is_read_from_the_environment_when_not_passed() -> None:
    assert ParallelConfig().with_environment({"NNODES": "3"}).nnodes == 3
    assert ParallelConfig(nnodes=2).with_environment({"NNODES": "3"}).nnodes == 2


def test_batch_shell_compares_nnodes_with_the_allocation() -> None:
    topo = from_environ({"SLURM_JOB_ID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2"})
    with pytest.raises(NodeCountError, match="the allocation has 2 nodes"):
        check(topo, ParallelConfig(nnodes=1), node_gpus=None)
    check(topo, ParallelConfig(nnodes=2), node_gpus=None)


def test_matching_launch_passes() -> None:
    check(from_environ(srun_env(3)), ParallelConfig(nnodes=2, gpus_per_node=2, tp=2), node_gpus=2)


def test_declared_gpus_per_node_must_be_visible() -> None:
    with pytest.raises(GpuCountError, match="GPUS_PER_NODE=8 but 4 GPUs are visible"):
        check(from_environ(srun_env(0)), ParallelConfig(gpus_per_node=8), node_gpus=4)


def test_more_tasks_than_gpus_on_a_node_fails() -> None:
    with pytest.raises(GpuCountError, match="2 processes on n1 but only 1 GPUs"):
        check(from_environ(srun_env(0)), ParallelConfig(), node_gpus=1)


def test_no_gpus_means_no_task_check_for_cpu_jobs() -> None:
    check(from_environ(srun_env(0)), ParallelConfig(), node_gpus=0)


def test_world_size_must_be_divisible_by_tp_pp_cp() -> None:
    with pytest.raises(ParallelismError, match=r"world size 4 is not divisible by TP x PP x CP = 2 x 1 x 3 = 6"):
        check(from_environ(srun_env(0)), ParallelConfig(tp=2, cp=3), node_gpus=None)


def test_parallel_sizes_below_one_are_rejected() -> None:
    with pytest.raises(ParallelismError, match="tp=0"):
        ParallelConfig(tp=0)


def test_a_master_port_in_use_is_named_before_the_rendezvous() -> None:
    import socket

    from slurmrt import ConfigError
    from slurmrt.launch.preflight import check_master_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        topo = from_environ(srun_env(0, MASTER_PORT=str(port)))
        with pytest.raises(ConfigError, match=rf"MASTER_PORT {port} is already in use on n1.*Fix: export MASTER_PORT"):
            check_master_port(topo)
        check_master_port(from_environ(srun_env(1, MASTER_PORT=str(port))))  # rank 0 alone serves the rendezvous
    check_master_port(topo)  # free again
