"""9. The hang watchdog: what it costs per step, how long a hang takes to end the process, and to a resumed run.

(a) Per-step cost: the stop-check loop (bench_stop_check's worker, 2 gloo ranks) with the watchdog on and off,
    alternated, the watcher polling every 0.2 s (25 times more often than the default 5 s). The training thread's
    side of the watchdog is the timestamp should_stop takes anyway, so the difference should be noise.
(b) Hang to exit: tests/integration/hang_worker.py on 3 ranks; rank 1 stops in user code at step 30 and the others
    block in a gloo all_reduce. From the moment rank 1 is stuck (its marker file) to the moment every process has
    exited, against the learned allowance (floors of 3 and 10 s; 180 s by default).
(c) Hang to resumed run, on the test cluster (tests/slurm/cluster.sh) when it runs: the 2-node job of
    tests/slurm/test_scenarios.py::test_13 (hang); from the hung rank's last step boundary to the resumed run's
    resume event. Mostly Slurm's own delay before a requeued job starts again.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ._common import HERE, ROOT, Section, run_ranks, table

sys.path.insert(0, str(ROOT))
from tests.integration.launch import start, wait_all  # noqa: E402 - the tests' launcher: a fake srun step

STOP_CHECK = HERE / "_stop_check_worker.py"
HANG = ROOT / "tests" / "integration" / "hang_worker.py"


def _per_step(quick: bool) -> tuple[str, dict[str, float]]:
    steps = "4000" if quick else "20000"
    samples: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(2 if quick else 4):
        for mode in ("on", "off"):
            env = {"SLURMRT_WATCHDOG": "1" if mode == "on" else "0", "SLURMRT_WATCH_INTERVAL_S": "0.2"}
            results = run_ranks(STOP_CHECK, 2, [steps, "0"], extra_env=env)
            slowest = {k: max(r[k] for r in results) for k in results[0]}
            samples[mode].append((slowest["slurmrt"] - slowest["empty"]) * 1e6)
    on, off = statistics.median(samples["on"]), statistics.median(samples["off"])
    rows = [[mode, f"{statistics.median(v):.2f}", ", ".join(f"{x:.2f}" for x in v)] for mode, v in samples.items()]
    text = table(["watchdog", "should_stop +µs/step (median)", "each run"], rows)
    text += (f"\n\nDifference on - off: {on - off:+.2f} µs per step, within the run-to-run spread of either; "
             f"{steps} steps per run, 2 ranks, slowest rank.")
    return text, {"on_us": on, "off_us": off}


def _hang_to_exit(floor: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        env = {"SLURMRT_CHECKPOINT_DIR": str(d / "ckpt"), "SLURMRT_HANG_FLOOR_S": str(floor),
               "SLURMRT_STARTUP_TIMEOUT_S": "300", "SLURMRT_WATCH_INTERVAL_S": "0.5"}
        procs = start(3, d, ["--mode", "sleep", "--out", str(d)], script=HANG, extra=env)
        while not (d / "stuck").exists():
            time.sleep(0.01)
        stuck = time.time()
        codes = wait_all(procs, 600)
        ended = time.time()
        if codes != [5, 5, 5]:
            raise RuntimeError(f"hang_worker exited {codes}")
        events = [json.loads(line) for line in (d / "ckpt" / "events-4242.jsonl").read_text().splitlines()]
        fired = [e for e in events if e["event"] == "hang" and e["activity"] == "step"]
        return {"allowance_s": min(e["allowed_s"] for e in fired), "exit_s": ended - stuck,
                "suspect_ok": float([s["rank"] for s in next(e for e in events if e["event"] == "suspects")
                                     ["suspects"]] == [1])}


def _cluster() -> tuple[str, dict[str, float]]:
    conf = Path("/tmp/slurmrt-cluster/slurm.conf")
    if not conf.exists():
        return "not measured: the test cluster is not running (`sudo bash tests/slurm/cluster.sh start`)", {}
    from tests.slurm.conftest import slurm
    from tests.slurm.test_scenarios import _fault_job

    if "UP" not in slurm("scontrol", "ping", check=False):
        return "not measured: the test cluster does not answer", {}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        d = Path(tmp)
        job = _fault_job(d, "hang", "--kill-on-bad-exit=1")
        info = job.wait(900)
        events = [json.loads(line) for line in (d / "ckpt" / f"events-{job.id}.jsonl").read_text().splitlines()]
    hang = next(e for e in events if e["event"] == "hang" and e["activity"] == "step")
    from slurmrt.record.events import timestamp

    stuck = timestamp(hang) - hang["idle_s"]
    requeued = timestamp(next(e for e in events if e["event"] == "requeue"))
    resumed = timestamp(next(e for e in events if e["event"] == "resume" and e["restart"] == 1))
    started = timestamp(next(e for e in events if e["event"] == "init" and e["restart"] == 1))
    figures = {"detect_s": requeued - stuck, "requeue_to_start_s": started - requeued, "hang_to_resume_s":
               resumed - stuck, "allowance_s": hang["allowed_s"]}
    rows = [[f"{hang['allowed_s']:.1f}", f"{requeued - stuck:.1f}", f"{started - requeued:.1f}",
             f"{resumed - started:.1f}", f"{resumed - stuck:.1f}", info["JobState"]]]
    text = table(["allowance s", "hang to requeue + exclusion s", "requeue to the next run's init s",
                  "init to resume s", "hang to resumed run s", "job"], rows)
    return text + "\n\nFloor 5 s (180 s by default). The wait between the requeue and the next run is Slurm's.", figures


def run(quick: bool = False) -> Section:
    per_step, figures = _per_step(quick)
    rows = []
    for floor in (3.0, 10.0):
        got = _hang_to_exit(floor)
        figures[f"floor_{floor:g}"] = got
        rows.append([f"{floor:g}", f"{got['allowance_s']:.1f}", f"{got['exit_s']:.1f}",
                     f"{got['exit_s'] / got['allowance_s']:.2f}", "yes" if got["suspect_ok"] else "no"])
    exit_table = table(["floor s", "learned allowance s", "stuck to every process exited s", "ratio",
                        "suspect named"], rows)
    cluster, cluster_figures = (("not run with --quick", {}) if quick else _cluster())
    figures["cluster"] = cluster_figures
    body = ("**(a) Per-step cost**\n\n" + per_step + "\n\n**(b) Hang to exit** (3 ranks, steps of 0.05 s, watcher "
            "every 0.5 s)\n\n" + exit_table + "\n\nThe time past the allowance is the watcher's poll period, the "
            "census (every stalled rank answers within one poll) and the leader's requeue and exclusion.\n\n"
            "**(c) Hang to resumed run on the test cluster**\n\n" + cluster)
    return Section("Hang watchdog", body, figures)
