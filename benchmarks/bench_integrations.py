"""8. The trainers: per-step cost of slurmrt's callback in the Hugging Face Trainer and in Lightning, against the same
Trainer without it (2 gloo ranks, a tiny model, no saves), and the stop under `slurmrt sim`: steps from the signal
to the agreed stop, and seconds from the signal to the exit."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ._common import ROOT, Section, run_ranks, table

PROBE = ROOT / "benchmarks" / "_integrations_worker.py"


def run(quick: bool = False) -> Section:
    steps, rounds = (60, 2) if quick else (200, 4)
    rows, figures = [], {}
    for framework in ("transformers", "lightning"):
        if importlib.util.find_spec(framework) is None:
            rows.append([framework, "not installed", "", "", "", "", ""])
            continue
        results = run_ranks(PROBE, 2, [framework, str(steps), str(rounds)], timeout=1800)
        slowest = max(results, key=lambda r: r["with"])
        with_cb, without = slowest["with"], slowest["without"]
        latency, to_exit = _stop(framework)
        figures[framework] = {"with_ms": with_cb * 1e3, "without_ms": without * 1e3, "stop_steps": latency,
                              "signal_to_exit_s": to_exit}
        rows.append([framework, f"{without * 1e3:.2f}", f"{with_cb * 1e3:.2f}", f"{(with_cb - without) * 1e6:+.0f}",
                     f"{with_cb / without:.3f}", str(latency), f"{to_exit:.2f}"])
    body = table(["trainer", "ms/step without", "ms/step with slurmrt", "µs/step added", "ratio",
                  "stop: steps after the signal", "signal to exit, s"], rows)
    body += (f"\n\nPer-step time: median of {steps} steps after 10 of warm-up, {rounds} alternating rounds with and "
             "without the callback in the same processes, median of the rounds, slowest rank. A tiny model on 2 "
             "cores: the step is milliseconds, so the ratio is an upper bound for real models. The stop: the example "
             "under `slurmrt sim` (1 node x 2 tasks, 0.1 s of simulated work per step), USR1 right after the first "
             "checkpoint; steps counted from the step in progress when rank 0 recorded the signal to the agreed "
             "step, time from the signal to rank 0's exit event (the save of the stop included).")
    return Section("The Hugging Face Trainer and Lightning", body, figures)


def _stop(framework: str) -> tuple[int, float]:
    from slurmrt.record.events import read_events, timestamp

    example = ROOT / "examples" / framework / "train.py"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--checkpoint-dir", f"{tmp}/ckpt", "--steps", "60", "--step-time", "0.1"]
        args += ["--output-dir", f"{tmp}/out", "--save-steps", "10"] if framework == "transformers" else \
            ["--save-every", "10"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
        env.update({"PYTHONPATH": str(ROOT / "src"), "SLURMRT_PROGRESS_S": "1", "OMP_NUM_THREADS": "1"})
        out = subprocess.run([sys.executable, "-m", "slurmrt", "sim", "-N", "1", "--ntasks-per-node", "2",
                              "--preempt-at", "0", "--after-checkpoint", "--signal", "USR1", "--grace", "60",
                              "--requeue", "--", sys.executable, str(example), *args], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
        events = [e for e in read_events(next(Path(tmp, "ckpt").glob("events-*.jsonl"))) if e["restart"] == 0]
    signal = next(e for e in events if e["event"] == "signal" and e["rank"] == 0)
    received = float(signal["received"])
    in_progress = max((e["step"] for e in events if e["event"] == "progress" and timestamp(e) <= received),
                      default=0) + 1
    decision = next(e for e in events if e["event"] == "decision")
    exit_event = next(e for e in events if e["event"] == "exit")
    return decision["step"] - in_progress, timestamp(exit_event) - received


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv).figures, indent=1))
