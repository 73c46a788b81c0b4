"""The fault campaign's neighbour series: what another job or user does to a job under ``slurmrt sim``.

Two kinds, in turn, each at a moment drawn from a seed (seconds after the job's first checkpoint):

- ``disk-full``: the checkpoint directory is a small filesystem of its own (a 16 MiB tmpfs: root only), which a
  neighbour fills. The save that meets the full disk must fail on every rank with a clear error (``CheckpointError``,
  "previous checkpoint is intact", the free-space fix); the job ends (exit 1, not requeued: the disk stays full); no
  damaged checkpoint and no temporary one is left. Once the neighbour's file is gone, the job submitted again
  resumes from the last checkpoint and ends with the weights of an uninterrupted run, bit for bit.
- ``second-job``: while the job trains, another job starts on the same checkpoint directory. It must be refused
  (the lease: "in use by job"), and the first must end with the uninterrupted weights.

    python -m benchmarks.chaos_neighbours --trials 20 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from slurmrt.checkpoint.manifest import verify
from slurmrt.record.events import read_events, timestamp

from .chaos import (
    ENV,
    NODES,
    ROOT,
    Trial,
    batch_script,
    final_weights,
    from_scratch,
    leftovers,
    reference,
    summarize,
)

KINDS = ("disk-full", "second-job")
DISK_MB = 16
#: Long enough (10 s of steps) that a second job, which takes seconds to start, meets the first one training.
NEIGHBOUR_STEPS = 200
FAILED_SAVE = ("CheckpointError", "previous checkpoint is intact", "fix: free space")


def _sim(directory: Path, steps: int, *, ckpt: Path | None = None) -> subprocess.Popen[str]:
    """The job under ``slurmrt sim`` (requeueable), in ``directory``; ``ckpt``: another checkpoint directory than
    its own."""
    script = batch_script(directory, Trial(0, "neighbour", 0, 0.0, 0), steps)
    if ckpt is not None:
        script.write_text(script.read_text().replace(str(directory / "ckpt"), str(ckpt)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE"))}
    env.update(ENV, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(directory))
    return subprocess.Popen([sys.executable, "-m", "slurmrt", "sim", "-N", str(NODES), "--ntasks-per-node", "1",
                             "--requeue", "--", str(script)], cwd=directory, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _after_first_checkpoint(directory: Path, proc: subprocess.Popen[str], at_s: float) -> bool:
    """Wait for the first checkpoint, then ``at_s`` more; False when the job ended first."""
    while not (directory / "ckpt" / "latest").exists():
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    time.sleep(at_s)
    return proc.poll() is None


def _fill(path: Path) -> None:
    """Write zeros into ``path`` until the filesystem is full."""
    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 65536)


def _intact(ckpt: Path) -> str | None:
    """Why the checkpoint directory is not clean (a temporary save left, a committed one damaged), or None."""
    left = [p.name for p in ckpt.glob(".tmp-*")]
    if left:
        return f"temporary saves left: {left}"
    for step in sorted(ckpt.glob("step_*")):
        problems = verify(step)
        if problems:
            return f"{step.name} damaged: {problems}"
    return None


def disk_full(directory: Path, at_s: float, steps: int, expected: list[float]) -> tuple[str, str]:
    ckpt = directory / "ckpt"
    ckpt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=700", "tmpfs", str(ckpt)], check=True)
    try:
        proc = _sim(directory, steps)
        if not _after_first_checkpoint(directory, proc, at_s):
            proc.communicate()
            return "survived", "ended before the disk filled"
        _fill(ckpt / "neighbour.bin")
        first = proc.communicate(timeout=600)[0]
        (directory / "sim-full.out").write_text(first)
        if proc.returncode == 0:
            return "survived", "finished before its next save"
        if not all(s in first for s in FAILED_SAVE):
            return "dead", f"no clear error for the full disk (exit {proc.returncode}): {first[-1500:]}"
        if (why := _intact(ckpt)) is not None:
            return "lost", why
        (ckpt / "neighbour.bin").unlink()
        again = _sim(directory, steps)
        second = again.communicate(timeout=600)[0]
        (directory / "sim-again.out").write_text(second)
        if again.returncode != 0:
            return "dead", f"the job submitted again did not finish: {second[-1500:]}"
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)
    return _weights_verdict(directory, expected)


def second_job(directory: Path, at_s: float, steps: int, expected: list[float]) -> tuple[str, str]:
    proc = _sim(directory, steps)
    if not _after_first_checkpoint(directory, proc, at_s):
        proc.communicate()
        return "survived", "ended before the second job came"
    intruder_dir = directory / "intruder"
    intruder_dir.mkdir()
    said = _sim(intruder_dir, steps, ckpt=directory / "ckpt").communicate(timeout=600)[0]
    (intruder_dir / "sim.out").write_text(said)
    first = proc.communicate(timeout=600)[0]
    (directory / "sim.out").write_text(first)
    if "in use by job" not in said:
        if _one_after_the_other(directory / "ckpt"):
            return "survived", "the first job had ended: the directory was free"
        return "lost", f"the second job was not refused: {said[-1500:]}"
    if proc.returncode != 0:
        return "dead", f"the first job did not finish: {first[-1500:]}"
    return _weights_verdict(directory, expected)


def _one_after_the_other(ckpt: Path) -> bool:
    """The two jobs' event logs in ``ckpt`` do not overlap in time: the second began after the first's last event."""
    spans = []
    for log in ckpt.glob("events-*.jsonl"):
        times = [timestamp(e) for e in read_events(log) if "time" in e]
        if times:
            spans.append((min(times), max(times)))
    spans.sort()
    return len(spans) < 2 or spans[0][1] <= spans[1][0]


def _weights_verdict(directory: Path, expected: list[float]) -> tuple[str, str]:
    weights = final_weights(directory)
    if weights != expected:
        return "lost", f"final weights {weights} != uninterrupted {expected}"
    if (scratch := from_scratch(directory)) is not None:
        return "lost", scratch
    if left := leftovers(directory):
        return "leftover", f"processes {left} outlived the job"
    return "survived", ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=NEIGHBOUR_STEPS)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("chaos_neighbours: disk-full trials mount a tmpfs: run as root; only second-job trials run",
              file=sys.stderr)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="slurmrt-neighbours-"))
    started, faults, failures = time.monotonic(), Counter[tuple[str, str]](), []
    try:
        expected = reference(work, args.steps)
        for n in range(args.trials):
            kind, at_s = KINDS[n % len(KINDS)], rng.uniform(0.0, 2.0)
            if kind == "disk-full" and os.geteuid() != 0:
                continue
            directory = work / f"trial-{n:04d}-{kind}"
            directory.mkdir()
            verdict, detail = (disk_full if kind == "disk-full" else second_job)(directory, at_s, args.steps,
                                                                                 expected)
            faults[(kind, verdict)] += 1
            print(f"trial {n} {kind} (at {at_s:.2f} s): {verdict}{f' ({detail})' if detail else ''}", flush=True)
            if verdict != "survived":
                failures.append(f"seed {args.seed} trial {n} {kind}: {verdict}: {detail}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return summarize(f"seed {args.seed}, {args.trials} trials in {time.monotonic() - started:.0f} s; command: "
                     f"python -m benchmarks.chaos_neighbours --trials {args.trials} --seed {args.seed} --steps "
                     f"{args.steps}", faults, failures, KINDS)


if __name__ == "__main__":
    sys.exit(main())
