"""Hostile surroundings that take another process to show: a lease whose holder is gone, damage injected into
every file of a checkpoint while a resume runs, an unreadable kill switch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from slurmrt.checkpoint import lease as lease_module
from slurmrt.checkpoint.lease import LEASE_FILE
from slurmrt.cli import main
from tests.unit.test_hostile_checkpoints import _flip, _lease, _resume, _save_with_every_kind

ROOT = Path(__file__).resolve().parents[2]


def _damages(path: Path) -> list[tuple[str, Callable[[], None]]]:
    size = path.stat().st_size

    def symlink() -> None:
        copy = path.with_name(path.name + ".copy")
        copy.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(copy)

    return [("deleted", path.unlink), ("emptied", lambda: path.write_bytes(b"")),
            ("truncated", lambda: path.write_bytes(path.read_bytes()[: size // 2])),
            ("flipped first byte", lambda: _flip(path, 0)), ("flipped middle byte", lambda: _flip(path, size // 2)),
            ("flipped last byte", lambda: _flip(path, -1)), ("replaced by a symlink", symlink)]


def test_damage_at_every_file_of_a_checkpoint_falls_back_to_the_sound_one(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    _save_with_every_kind(pristine)
    names = sorted(str(p.relative_to(pristine / "step_000000002")) for p in (pristine / "step_000000002").rglob("*")
                   if p.is_file())
    assert "manifest.json" in names and "local/rank_00000.pt" in names
    cases = 0
    for name in names:
        for index, (what, _) in enumerate(_damages(pristine / "step_000000002" / name)):
            root = tmp_path / f"case{cases}"
            subprocess.run(["cp", "-a", str(pristine), str(root)], check=True)
            _damages(root / "step_000000002" / name)[index][1]()
            store, step, state = _resume(root, keep_last=5)
            assert step == 1, f"{name} {what}: resumed from {step}"
            assert torch.equal(state["w"], torch.full((64,), 1.0)), f"{name} {what}"
            assert main(["verify", str(root)]) == 1, f"{name} {what}: verify called it sound"
            store.save({"w": torch.full((64,), 2.0)}, 2, local={"rng": 2})  # the sound save replaces the damage
            assert _resume(root)[1] == 2, f"{name} {what}: the damaged step 2 was not replaced"
            cases += 1
    assert cases == len(names) * 7


def test_a_lease_whose_process_is_gone_from_this_host_is_stale(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = {"owner": "local-a", "host": "vm", "pid": gone.pid, "start": 1, "heartbeat": lease_module._clock.wall()}
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    _lease(tmp_path, "local-b", alive=None, host="vm").acquire()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to play another user (setpriv --reuid=65534)")
def test_an_unreadable_kill_switch_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    private = Path("/tmp") / f"slurmrt-private-{os.getpid()}"
    private.mkdir(mode=0o700)
    try:
        code = ("from pathlib import Path\nfrom slurmrt.stop.killswitch import exists\n"
                "from slurmrt import ConfigError\n"
                f"try:\n    exists(Path({str(private / 'STOP')!r}))\nexcept ConfigError as e:\n    print(e)\n")
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              code], capture_output=True, text=True, env={**os.environ,
                                                                          "PYTHONPATH": str(ROOT / "src")})
    finally:
        private.rmdir()
    assert "cannot be looked at" in out.stdout and "Traceback" not in out.stderr, out.stderr


LATE_WARNING = """
import os, signal, slurmrt
rt = slurmrt.init(deadline=False)
code = rt.finish()
for _ in range(20):  # a storm of the job's warning, as the finished task tears down
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR2)
print("still here after the storm, code", int(code))
"""


def test_a_warning_storm_after_finish_leaves_a_finished_task_finished(tmp_path: Path) -> None:
    """The chaos campaign's signal storm hit a task that had finished its training: it died of SIGUSR1 (srun's
    "User defined signal 1", exit 138) and the job ended failed. Once slurmrt is done, a warning is ignored."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update(PYTHONPATH=str(ROOT / "src"), SLURMRT_EVENT_LOG=str(tmp_path / "events.jsonl"))
    out = subprocess.run([sys.executable, "-c", LATE_WARNING], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "still here after the storm, code 0" in out.stdout
