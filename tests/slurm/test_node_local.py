"""A checkpoint directory that one node of a real Slurm job does not share: on the test cluster every node sees one
filesystem, so node 1's task mounts a tmpfs over the checkpoint path in a mount namespace of its own, as a
node-local /tmp or scratch is. Before the survey, this job COMPLETED and said "committed" at every save while node 1's
parts existed only in its tmpfs; now every rank stops before its first save, in seconds, with one line per node."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import submit

pytestmark = pytest.mark.timeout(600)

# Node 1's task sees its own empty directory at the checkpoint path; node 0's the shared one.
BODY = r"""srun --kill-on-bad-exit=1 bash -c '
if [ "$SLURM_NODEID" = 1 ]; then
    exec unshare -m --propagation private \
        sh -c "mount -t tmpfs node-local \"\$SLURMRT_CHECKPOINT_DIR\" && exec \"\$@\"" sh \
        $PY $WORKER --out $OUT --steps 30 --step-time 0.05 --save-every 5
fi
exec $PY $WORKER --out $OUT --steps 30 --step-time 0.05 --save-every 5'
exit $?"""


def test_a_checkpoint_directory_one_node_does_not_share_stops_the_job_before_its_first_save(cluster: Path,
                                                                                           tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.fail("unshare(1) (util-linux) is missing")
    (tmp_path / "ckpt").mkdir(parents=True)
    job = submit(tmp_path, f"export PY WORKER OUT\n{BODY}", "-N2", "--ntasks-per-node=1", "--requeue",
                 name="node-local")
    info = job.wait(300)
    out = job.output()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "78:0", out[-3000:]
    said = [line for line in out.splitlines() if "is not one directory for every node" in line]
    assert said and all("n2 see(s) another directory" in line and "Fix:" in line for line in said), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not list((tmp_path / "ckpt").glob("step_*")), "a checkpoint was committed"
