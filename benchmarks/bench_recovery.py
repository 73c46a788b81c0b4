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

from ._common import HERE, ROOT, Section, run_ranks, table

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
    resumed = next(e for e in ev if e["event"] == "resume" and second(e))
    resume = timestamp(resumed)
    lost = 35 - resumed["step"]
    return {"response_s": decided - start, "to_init_s": init - decided, "load_s": resume - init,
            "fault_to_resume_s": resume - start, "lost_steps": float(lost), "tier": resumed.get("tier", "shared"),
            "from_peers": resumed.get("from_peers")}


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
                                               f"--step-time 0.1 --save-every 10 --local-every 5 --fault {fault} "
                                               "--fault-at 35", local=True))
            jobs["requeue"] = (d_rq, _fault_job(d_rq, fault, "--kill-on-bad-exit=1" if fault == "hang"
                                                else "--kill-on-bad-exit=0"))
            for how, (d, job) in jobs.items():
                info = job.wait(900)
                if info["JobState"] != "COMPLETED":
                    raise RuntimeError(f"{how} {fault}: job {job.id} {info['JobState']}")
                got = _breakdown(_events(d, job), fault, how == "in-job")
                figures[f"{how}_{fault}"] = got
                rows.append([fault, how, f"{got['response_s']:.1f}", f"{got['to_init_s']:.1f}",
                             f"{got['load_s']:.1f}", f"{got['fault_to_resume_s']:.1f}", f"{got['lost_steps']:.0f}",
                             got["tier"], "-" if got["from_peers"] is None else str(got["from_peers"])])
    for fault in ("kill", "hang"):
        a, b = figures[f"in-job_{fault}"], figures[f"requeue_{fault}"]
        figures[f"ratio_{fault}"] = a["fault_to_resume_s"] / b["fault_to_resume_s"]
    text = table(["fault", "path", "response s", "to the next init s", "init to resume s", "fault to resume s",
                  "steps lost", "resumed from", "bytes from peers"], rows)
    text += (f"\n\nIn-job against requeue, fault to resume: {figures['ratio_kill']:.2f} (kill), "
             f"{figures['ratio_hang']:.2f} (hang). The response is the census (3 s once srun's SIGTERM came, for a "
             "kill) or the hang allowance (floor 5 s here, 180 s by default) plus the census. The requeue's wait "
             "to the next init is Slurm's (the credential expiry, 10 s on this cluster; about 2 minutes by "
             "default; then the queue). Steps lost: the fault at step 35 less the step resumed from: the in-job "
             "runs save to the local tier every 5 steps and to the shared one every 10, the requeued ones to the "
             "shared one every 10 (a requeued run lands on other nodes, where a local tier holds nothing). "
             "In-job, nothing is read from the shared tier: rank 0 reads its own part on n1, the spare's rank 1 "
             "receives rank 1's part from n1, its partner (bytes from peers).")
    return text, figures


def _save_stall(quick: bool) -> tuple[str, dict[str, float]]:
    """A blocking save of the same state to each tier, 2 ranks each playing its own node, alternated."""
    import os

    mb = 16 if quick else 256
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLURMRT_BENCH_DIR") or None) as tmp, \
            tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        env = {"SLURMRT_CHECKPOINT_DIR": tmp, "SLURMRT_LOCAL_CHECKPOINT_DIR": shm}
        results = run_ranks(HERE / "_local_tier_worker.py", 2, [str(mb), "2" if quick else "5"], extra_env=env)
    shared, local = (max(r[k] for r in results) for k in ("shared", "local"))
    text = table(["state per rank", "shared tier (checkpoint dir) s", "local tier (/dev/shm + replica) s",
                  "local / shared"], [[f"{mb} MiB", f"{shared:.3f}", f"{local:.3f}", f"{local / shared:.2f}"]])
    text += ("\n\nMedians of alternated blocking saves, slowest rank. The local save writes the rank's part to "
             "/dev/shm and sends it to its partner over gloo, which writes it too: the same bytes twice, to "
             "memory, against once to the disk with the manifest, fsyncs and the commit. The shared tier here is "
             "this machine's local disk; a shared parallel filesystem under other jobs' load was not measured. "
             "Here the local tier's cost is the replication: gloo over loopback TCP on 2 cores.")
    return text, {"mb": mb, "shared_s": shared, "local_s": local, "ratio": local / shared}


def run(quick: bool = False) -> Section:
    stall, stall_figures = _save_stall(quick)
    text, figures = ("not run with --quick", {}) if quick else _cluster()
    figures["save_stall"] = stall_figures
    body = ("**(a) Fault to resumed training on the test cluster**\n\n" + text +
            "\n\n**(b) A save to the local tier against the shared tier**\n\n" + stall)
    return Section("Recovery: in the job against a requeue", body, figures)
