"""The launcher read off a command line as /proc shows it (the shell has expanded it): every form the guides and
users write, and the ones that are not a launcher."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from slurmrt import NodeRankError
from slurmrt.launch.launcher import identify, python_target, rendezvous_backend
from slurmrt.launch.topology import from_environ

from .test_topology import torchrun_under_srun

REST = "--nproc_per_node 2 --nnodes 2 --node_rank 1 --rdzv_endpoint n1:29500 --rdzv_backend c10d --max_restarts 0"
LAUNCH = "--num_machines 2 --num_processes 4 --machine_rank 1 --main_process_ip n1 --main_process_port 29500"


@pytest.mark.parametrize(("line", "launcher"), [
    # The Slurm guide's LAUNCHER, as srun bash -c runs it once the shell expanded $LAUNCHER.
    (f"python -u -m torch.distributed.run {REST} train.py --lr 1", "torch.distributed.run"),
    (f"python3 -X faulthandler -u -m torch.distributed.run {REST} train.py", "torch.distributed.run"),
    (f"python3.11 -Xfaulthandler -Wignore -um torch.distributed.run {REST} train.py", "torch.distributed.run"),
    (f"/usr/bin/python3 -W ignore::DeprecationWarning -B -m torch.distributed.run {REST} t.py",
     "torch.distributed.run"),
    (f"python -m torch.distributed.launch --use-env {REST} train.py", "torch.distributed.launch"),
    (f"python -u -m accelerate.commands.launch {LAUNCH} train.py", "accelerate"),
    (f"python -m accelerate.commands.accelerate_cli launch {LAUNCH} train.py", "accelerate"),
    (f"torchrun {REST} train.py", "torch.distributed.run"),
    (f"/opt/envs/a/bin/python3 /opt/envs/a/bin/torchrun {REST} train.py", "torch.distributed.run"),
    (f"/opt/envs/a/bin/python3 /opt/envs/a/bin/accelerate launch {LAUNCH} train.py", "accelerate"),
    (f"uv run torchrun {REST} train.py", "torch.distributed.run"),
    (f"uv run --no-project --python 3.11 python -m torch.distributed.run {REST} train.py", "torch.distributed.run"),
    (f"uv run --with numpy -- python -u -m torch.distributed.run {REST} train.py", "torch.distributed.run"),
    (f"conda run -n train --no-capture-output torchrun {REST} train.py", "torch.distributed.run"),
    (f"env A=B NCCL_DEBUG=INFO torchrun {REST} train.py", "torch.distributed.run"),
    (f"env -u CUDA_VISIBLE_DEVICES A=B python -u -m torch.distributed.run {REST} train.py", "torch.distributed.run"),
    (f"env A=B uv run python3 -X faulthandler -m torch.distributed.run {REST} train.py", "torch.distributed.run"),
])
def test_every_way_of_writing_the_launcher_is_recognised_with_its_rendezvous(line: str, launcher: str) -> None:
    found = identify(shlex.split(line))
    assert found is not None, line
    assert found[0] == launcher
    assert rendezvous_backend(found[1]) == ("static" if launcher == "accelerate" else "c10d")


@pytest.mark.parametrize("line", [
    "python train.py --nnodes 2",
    "python -u train.py -m torch.distributed.run",  # -m after the script belongs to the script
    "python -c 'import torch.distributed.run'",
    "python -",
    "python -Q new -m torch.distributed.run",  # an option the interpreter does not have: cannot tell
    "accelerate config",
    "accelerate env",
    "bash -c 'torchrun x.py'",  # the shell is not the launcher; the torchrun it starts is a process of its own
    "uv run train.py",
    "uv pip install torchrun",
    "env A=B python train.py",
    "srun torchrun x.py",
    "",
])
def test_what_is_not_a_launcher_is_not_taken_for_one(line: str) -> None:
    assert identify(shlex.split(line)) is None


@pytest.mark.parametrize(("line", "target"), [
    ("python -u -m m a", ("module", "m", ["a"])),
    ("python -X importtime -W error -m m", ("module", "m", [])),
    ("python -Ximporttime -mm -x", ("module", "m", ["-x"])),
    ("python -OO -I s.py -m x", ("script", "s.py", ["-m", "x"])),
    ("python --check-hash-based-pycs never s.py", ("script", "s.py", [])),
    ("python -- -weird.py", ("script", "-weird.py", [])),
    ("python -uc 'print(1)' a", ("command", "print(1)", ["a"])),
    ("python -X", None),
    ("python -m", None),
    ("python", None),
])
def test_python_command_lines_are_read_as_the_interpreter_reads_them(line: str, target: object) -> None:
    assert python_target(shlex.split(line)) == target


def test_a_console_script_under_another_name_is_known_by_the_module_it_runs(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "launch-my-job"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom torch.distributed.run import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main())\n")
    found = identify([sys.executable, str(script), "--nnodes", "2", "--rdzv-backend=c10d", "x.py"])
    assert found == ("torch.distributed.run", ["--nnodes", "2", "--rdzv-backend=c10d", "x.py"])
    other = tmp_path / "bin" / "tool"
    other.write_text(f"#!{sys.executable}\nfrom mypkg.cli import main\n")
    assert identify([sys.executable, str(other), "x.py"]) is None
    assert identify([str(tmp_path / "bin" / "missing"), "x.py"]) is None


def test_when_slurmrt_cannot_see_the_launcher_the_refusal_says_so_and_names_the_override() -> None:
    with pytest.raises(NodeRankError, match=r"found no torchrun or accelerate launch among the parents.*"
                                            r"SLURMRT_ALLOW_NODE_RANK_REORDER=1"):
        from_environ(torchrun_under_srun(1, 0, group_rank=0), launcher_argv=None)
    static = shlex.split("python -u -m torch.distributed.run --nnodes 2 --node_rank 0 --master_addr n1 x.py")
    with pytest.raises(NodeRankError, match=r"rendezvous is static.*SLURMRT_ALLOW_NODE_RANK_REORDER=1"):
        from_environ(torchrun_under_srun(1, 0, group_rank=0), launcher_argv=static)


def test_the_guides_line_is_accepted_where_its_group_rank_differs_from_slurm_nodeid() -> None:
    line = shlex.split(f"python -u -m torch.distributed.run {REST} train.py")
    topo = from_environ(torchrun_under_srun(1, 0, group_rank=0), launcher_argv=line)
    assert topo.node_rank == 0


def test_a_console_script_started_by_a_relative_path_is_read_from_the_launchers_directory(tmp_path: Path) -> None:
    script = tmp_path / "tools" / "go"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/python3\nfrom accelerate.commands.launch import main\n")
    assert identify(["/usr/bin/python3", "tools/go", "x.py"], cwd=str(tmp_path)) == ("accelerate", ["x.py"])
    assert identify(["/usr/bin/python3", "tools/go", "x.py"], cwd=str(tmp_path / "tools")) is None


def test_a_script_that_is_a_fifo_or_a_directory_is_no_launcher_and_never_blocks(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    assert identify([sys.executable, str(fifo), "x.py"]) is None
    assert identify([sys.executable, str(tmp_path), "x.py"]) is None
