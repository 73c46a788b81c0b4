"""10. Recovery: from a fault to the resumed training, in the job (a spare node, `slurmrt run`) against a requeue.

On the test cluster (tests/slurm/cluster.sh) when it runs; the jobs of tests/slurm/test_scenarios.py: the test worker,
2 ranks, gloo, 0.1 s steps, a checkpoint every 10 steps; rank 1's task dies of SIGKILL (or hangs) at step 35.

- in-job: 3 nodes, `exec slurmrt run --spare-nodes 1`, --no-kill (test_14);
- requeue: 2 nodes, plain `srun` (test_13): slurmrt requeues the job without the node.

The fault's moment: for a kill, rank 0's `hang` event (its collective fails as the peer's socket closes, at once);
for a hang, the hung rank's last step boundary (the `hang` event's time less its idle time). Then: the response (the
census names the node; the request or the requeue is made), the next step's or run's `init`, its `resume` (torch
imported, the process group formed, the checkpoint read) and its first step (one step time later).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._common import ROOT, Section, table

sys.path.insert(0, str(ROOT))


def _events(d: Path, job: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "ckpt" / f"events-{job.id}.jsonl").read_text().splitlines()]


def _breakdown(ev: list[dict[str, Any]], fault: str, in_job: bool) -> dict[str, float]:
    from slurmrt.record.events import timestamp

    def second(e: dict[str, Any]) -> bool:
        return e.get("attempt") == 1 if in_job else e["restart"] == 1

    if fault == "hang":
        hung = next(e for e in ev if e["event"] == "hang" and e.get("activity") == "step")
        start = timestamp(hung) - hung["idle_s"]
    else:
        start = timestamp(next(e for e in ev if e["event"] == "hang" and e["rank"] == 0 and not second(e)))
    decided = timestamp(next(e for e in ev if e["event"] == ("in_job_restart" if in_job else "requeue")))
    init = timestamp(next(e for e in ev if e["event"] == "init" and e["rank"] == 0 and second(e)))
    resume = timestamp(next(e for e in ev if e["event"] == "resume" and second(e)))
    lost = 35 - max(e["step"] for e in ev if e["event"] == "save" and not second(e))
    return {"response_s": decided - start, "to_init_s": init - decided, "load_s": resume - init,
            "fault_to_resume_s": resume - start, "lost_steps": float(lost)}


def _cluster() -> tuple[str, dict[str, Any]]:
    conf = Path("/tmp/slurmrt-cluster/slurm.conf")
    if not conf.exists():
        return "not measured: the test cluster is not running (`sudo bash tests/slurm/cluster.sh start`)", {}
    from tests.slurm.conftest import slurm
    from tests.slurm.test_scenarios import INJOB_STEPS, _fault_job, _injob_job

    if "UP" not in slurm("scontrol", "ping", check=False):
        return "not measured: the test cluster does not answer", {}
    figures: dict[str, Any] = {}
    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for fault in ("kill", "hang"):
            jobs = {}
            d_in, d_rq = Path(tmp) / f"in-{fault}", Path(tmp) / f"rq-{fault}"
            jobs["in-job"] = (d_in, _injob_job(d_in, f"bench-in-{fault}", 3,
                                               f"--spare-nodes 1 -- $PY $WORKER --out $OUT --steps {INJOB_STEPS} "
                                               f"--step-time 0.1 --save-every 10 --fault {fault} --fault-at 35"))
            jobs["requeue"] = (d_rq, _fault_job(d_rq, fault, "--kill-on-bad-exit=1" if fault == "hang"
                                                else "--kill-on-bad-exit=0"))
            for how, (d, job) in jobs.items():
                info = job.wait(900)
                if info["JobState"] != "COMPLETED":
                    raise RuntimeError(f"{how} {fault}: job {job.id} {info['JobState']}")
                got = _breakdown(_events(d, job), fault, how == "in-job")
                figures[f"{how}_{fault}"] = got
                rows.append([fault, how, f"{got['response_s']:.1f}", f"{got['to_init_s']:.1f}",
                             f"{got['load_s']:.1f}", f"{got['fault_to_resume_s']:.1f}", f"{got['lost_steps']:.0f}"])
    for fault in ("kill", "hang"):
        a, b = figures[f"in-job_{fault}"], figures[f"requeue_{fault}"]
        figures[f"ratio_{fault}"] = a["fault_to_resume_s"] / b["fault_to_resume_s"]
    text = table(["fault", "path", "response s", "to the next init s", "init to resume s", "fault to resume s",
                  "steps lost"], rows)
    text += (f"\n\nIn-job against requeue, fault to resume: {figures['ratio_kill']:.2f} (kill), "
             f"{figures['ratio_hang']:.2f} (hang). The response is the census (3 s once srun's SIGTERM came, for a "
             "kill) or the hang allowance (floor 5 s here, 180 s by default) plus the census. The requeue's wait "
             "to the next init is Slurm's (the credential expiry, 10 s on this cluster; about 2 minutes by "
             "default; then the queue). Steps lost: the fault at step 35 less the last checkpoint; both paths read "
             "the checkpoint directory (no node-local tier yet), so every rank reads the whole state back.")
    return text, figures


def run(quick: bool = False) -> Section:
    text, figures = ("not run with --quick", {}) if quick else _cluster()
    return Section("Recovery: in the job against a requeue", text, figures)
