"""11. Stragglers and in-job recovery in the simulator: the timer's cost, the steps to a name, the false positives.

(a) The per-step cost of ``with rt.time_compute():`` against ``rt.should_stop(step)``, 2 gloo ranks, each the
    median of 5 rounds of 200,000 calls (an empty loop subtracted from both), the slower rank.
(b) ``slurmrt sim`` with 3 nodes of 1 rank each, the test worker (a busy-Python section of 300,000 additions timed,
    20 ms of sleep, a gloo all-reduce per step), 300 steps: node 1 slowed k times from the start (``--slow-node 1
    --slow-factor k``), and runs with no slow node; on the quiet machine, and while two busy loops spin (5 busy
    processes on 2 cores). The name's step is the step the ranks had reached when the round named it.
(c) In-job recovery against the requeue in the simulator: node 1 fails (after the first checkpoint) in a job with a
    spare and ``--no-kill``, and in one without (the requeue). From the simulator's fault to the resumed step.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._common import HERE, ROOT, Section, run_ranks, table

WORKER = ROOT / "tests" / "integration" / "worker.py"


def _cost() -> dict[str, float]:
    ranks = run_ranks(HERE / "_straggler_cost_worker.py", 2, [])
    return {k: max(r[k] for r in ranks) for k in ranks[0]}


def _sim(tmp: Path, *args: str, env: dict[str, str], watch: str | None = None) -> tuple[str, float | None]:
    """Run ``slurmrt sim``; its stdout, and the wall time at which a line containing ``watch`` appeared."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    full.update({"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env})
    proc = subprocess.Popen([sys.executable, "-m", "slurmrt", "sim", *args], cwd=tmp, env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen, lines = None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if watch and seen is None and watch in line:
            seen = time.time()
    proc.wait(900)
    return "".join(lines), seen


def _events(ckpt: Path) -> list[dict[str, Any]]:
    (log,) = ckpt.glob("events-*.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


@contextlib.contextmanager
def _busy(loops: int) -> Iterator[None]:
    """``loops`` busy Python loops beside the run (what the test suite is run under once before each stop)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _detection(quick: bool) -> tuple[list[list[str]], dict[str, Any]]:
    rows, figures = [], {}
    if quick:
        cases = [("none", None, 0), ("4", 4.0, 0), ("none", None, 2)]
    else:
        cases = [(label, factor, 0) for label, factor in (("none", None), ("1.1", 1.1), ("2", 2.0), ("4", 4.0))]
        cases += [("none", None, 2), ("4", 4.0, 2)]
    repeats = 1 if quick else 2
    for label, factor, loops in cases:
        for rep in range(repeats):
            with tempfile.TemporaryDirectory() as tmp, _busy(loops):
                d = Path(tmp)
                slow = ["--slow-node", "1", "--slow-factor", str(factor)] if factor else []
                _sim(d, "-N", "3", "--ntasks-per-node", "1", *slow, "--", sys.executable, str(WORKER), "--out",
                     str(d / "out"), "--steps", "300", "--step-time", "0.02", "--compute", "300000",
                     env={"SLURMRT_CHECKPOINT_DIR": str(d / "ckpt")})
                named = [e for e in _events(d / "ckpt") if e["event"] == "straggler"]
            first = named[0] if named else None
            figures[f"{label}_{loops}_{rep}"] = {"named": len(named), "step": first and first.get("step"),
                                                 "rank": first and first["straggler"],
                                                 "ratio": first and first["ratio"]}
            rows.append([label if factor else "no slow node", "quiet" if not loops else f"{loops} busy loops",
                         str(rep + 1), str(len(named)),
                         "-" if first is None else f"rank {first['straggler']}",
                         "-" if first is None else str(first.get("step")),
                         "-" if first is None else f"{first['ratio']:.2f}",
                         "-" if first is None else f"{first['cost']:.2f}"])
    return rows, figures


def _recovery() -> tuple[list[list[str]], dict[str, Any]]:
    from slurmrt.record.events import timestamp

    rows, figures = [], {}
    for how, args in (("in-job", ["-N", "3", "--spare-nodes", "1", "--no-kill"]), ("requeue", ["-N", "2"])):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            out, fault = _sim(d, *args, "--ntasks-per-node", "1", "--requeue", "--fail-node", "1", "--at", "0",
                              "--after-checkpoint", "--", sys.executable, str(WORKER), "--out", str(d / "out"),
                              "--steps", "100000", "--resume-steps", "20", "--step-time", "0.05", "--save-every",
                              "10", env={"SLURMRT_CHECKPOINT_DIR": str(d / "ckpt")}, watch=" fails: SIGKILL")
            ev = _events(d / "ckpt")
        second = [e for e in ev if (e.get("attempt") == 1 if how == "in-job" else e["restart"] == 1)]
        init = next(timestamp(e) for e in second if e["event"] == "init")
        resume = next(e for e in second if e["event"] == "resume")
        saved = max(e["step"] for e in ev if e["event"] == "save" and e["restart"] == 0 and not e.get("attempt"))
        assert fault is not None, out[-2000:]
        figures[how] = {"to_init_s": init - fault, "fault_to_resume_s": timestamp(resume) - fault,
                        "resumed_from": resume["step"], "last_saved": saved}
        rows.append([how, f"{init - fault:.1f}", f"{timestamp(resume) - init:.1f}",
                     f"{timestamp(resume) - fault:.1f}", str(resume["step"])])
    figures["ratio"] = figures["in-job"]["fault_to_resume_s"] / figures["requeue"]["fault_to_resume_s"]
    return rows, figures


def run(quick: bool = False) -> Section:
    cost = _cost()
    body = "**(a) The timer's cost per step, next to the stop check (2 ranks)**\n\n" + table(
        ["empty loop ns", "with rt.time_compute() ns", "rt.should_stop(step) ns", "timer / stop check"],
        [[f"{cost['empty_ns']:.0f}", f"{cost['timer_ns']:.0f}", f"{cost['stop_ns']:.0f}",
          f"{cost['timer_ns'] / cost['stop_ns']:.2f}"]])
    body += ("\n\nNet of the empty loop. The timer is two `perf_counter` reads, two reads of the thread's scheduler "
             "statistics (its wait for a core, taken out of the section) and a few additions per use, and every 20th "
             "use closes a window; nothing is sent per step: the window's six integers ride the agreement's rounds, "
             "which run anyway.")
    rows, detection = _detection(quick)
    body += "\n\n**(b) Steps from the slowdown to the name, and false positives (`slurmrt sim`)**\n\n" + table(
        ["node 1 slowed", "machine", "run", "stragglers named", "who", "named at step", "ratio", "cost (of a step)"],
        rows)
    body += ("\n\nThe slowdown is there from step 0, so the step of the name is the steps it took: the window that "
             "makes node 1 the suspect and 3 more, of 20 timed steps, plus the wait for the rounds (every 0.5 to 1 s) "
             "to see each window with every rank on it. The ratio is against the slowest rank on the other nodes; "
             "k is the slowdown of node 1's work, and its share of the machine's 2 cores moves the measured ratio "
             "below k. A false positive is a name where no node was slowed; the test suite also fails any test "
             "whose event logs name one (tests/conftest.py).")
    figures: dict[str, Any] = {"cost": cost, "detection": detection}
    if not quick:
        rec_rows, recovery = _recovery()
        figures["recovery"] = recovery
        body += "\n\n**(c) A node failure in the simulator: in the job against the requeue**\n\n" + table(
            ["path", "fault to the next init s", "init to resume s", "fault to resume s", "resumed from"], rec_rows)
        body += (f"\n\nIn-job against requeue: {recovery['ratio']:.2f}. The simulator requeues at once (Slurm waits "
                 "for the credential expiry, then the queue: 37.7 s against 6.0 s on the test cluster, section 10), "
                 "so here the two paths differ only by the requeue's own steps: the census's wait for the lost "
                 "rank, `scontrol requeue`, the end of the run and the start of the next. The in-job step starts as "
                 "soon as the job's NodeList has lost the node and the step has ended.")
    return Section("Stragglers, and recovery in the simulator", body, figures)
