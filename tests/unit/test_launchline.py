"""A launcher per node's node count, read from the command `slurmrt run` (or `slurmrt doctor --launch`) is about to
start, against the nodes it will run on: the guides' lines as users write them, through `bash -c` and a container's
own command, with their variables from the environment."""

from __future__ import annotations

import pytest

from slurmrt import NodeCountError
from slurmrt.cli.doctor import launch_gate
from slurmrt.launch.launchline import check, launcher_nodes

MEGATRON = ['bash', '-c', 'python -m torch.distributed.run \\\n    --nnodes "$NNODES" '
            '--nproc-per-node "$GPUS_PER_NODE" --node-rank "$SLURM_NODEID" examples/megatron/train_core.py --nnodes 7']


@pytest.mark.parametrize(("command", "env", "found"), [
    (["torchrun", "--nnodes", "3", "train.py"], {}, ("torch.distributed.run", "--nnodes 3", 3, 3)),
    (["python", "-u", "-m", "torch.distributed.run", "--nnodes=2", "t.py"], {},
     ("torch.distributed.run", "--nnodes 2", 2, 2)),
    (MEGATRON, {"NNODES": "2"}, ("torch.distributed.run", "--nnodes $NNODES (= 2)", 2, 2)),
    (["apptainer", "exec", "--nv", "img.sif", "bash", "-c", "accelerate launch --num_machines ${N} x.py"], {"N": "4"},
     ("accelerate", "--num_machines ${N} (= 4)", 4, 4)),
    (["torchrun", "--nnodes", "1:4", "t.py"], {}, ("torch.distributed.run", "--nnodes 1:4", 1, 4)),
    (["bash", "-c", "cd /x && exec torchrun --nnodes=$((N+1)) t.py"], {"N": "1"}, None),  # not guessed at
    (MEGATRON, {}, None),  # $NNODES unset here: not guessed at
    (["python", "train.py", "--nnodes", "3"], {}, None),  # the training's own option
    (["bash", "-c", "$PY -m torch.distributed.run --nnodes 3 t.py"], {"PY": "/v/bin/python3"},
     ("torch.distributed.run", "--nnodes 3", 3, 3)),  # the interpreter named by a variable
    (["torchrun", "t.py", "--nnodes", "3"], {}, None),  # after the script: the script's
    (["bash", "-c", "torchrun --nnodes 'unbalanced"], {}, None),
])
def test_the_launchers_node_count_is_read_as_the_shell_would_run_it(command: list[str], env: dict[str, str],
                                                                    found: tuple[str, str, int, int] | None) -> None:
    assert launcher_nodes(command, env) == found


def test_a_launcher_given_more_nodes_than_the_step_has_is_refused_with_the_value_the_rule_and_the_fix() -> None:
    """The guides' cautionary case: torchrun per node told 3 nodes in a 2-node job (NNODES itself left unset)."""
    command = [MEGATRON[0], MEGATRON[1], MEGATRON[2].replace('"$NNODES"', "$NODES")]
    with pytest.raises(NodeCountError, match=r"torchrun --nnodes \$NODES \(= 3\) but the job has 2 node\(s\): its "
                                             r"rendezvous would wait for 3 node\(s\) and hang.*Fix: do this"):
        check(command, {"NODES": "3"}, nodes=2, where="the job has", fix="do this")


def test_nnodes_itself_and_an_elastic_range_are_checked_and_a_fitting_launch_passes() -> None:
    with pytest.raises(NodeCountError, match="NNODES=3 but the job has 2"):
        check(["python", "train.py"], {"NNODES": "3"}, nodes=2, where="the job has", fix="f")
    with pytest.raises(NodeCountError, match="would wait for 3 to 4 node"):
        check(["torchrun", "--nnodes", "3:4", "t.py"], {}, nodes=2, where="the job has", fix="f")
    check(["torchrun", "--nnodes", "1:4", "t.py"], {}, nodes=2, where="the job has", fix="f")
    check(MEGATRON, {"NNODES": "2"}, nodes=2, where="the job has", fix="f")
    check(["python", "train.py"], {}, nodes=2, where="the job has", fix="f")


def test_the_batch_scripts_gate_says_one_line_and_exits_78(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2]", "NNODES": "2"}
    assert launch_gate(["torchrun", "--nnodes", "3", "t.py"], env) == 78
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchrun --nnodes 3 but the job has 2 node(s)" in err[0] and "Fix:" in err[0]
    assert launch_gate(["torchrun", "--nnodes", "$NNODES", "t.py"], env) == 0
