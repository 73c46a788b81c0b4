"""The guard: a one-node job, waiting on a ``--no-kill`` job, that requeues it when its batch node fails.

In-job recovery covers the loss of any node but one: the batch script's (the job's first). When that node fails,
Slurm kills the batch step with ``slurmrt run`` in it and ends the job FAILED, not requeued, ``--requeue`` or not;
nothing of the job is left to requeue it (measured on the test cluster, docs/slurm.md). So ``slurmrt run`` arms a
guard before its first step: ``sbatch --dependency=afternotok:JOB --kill-on-invalid-dep=yes`` of ``slurmrt guard``.

- The job ends COMPLETED: Slurm cancels the guard (its dependency can never be met).
- The job is requeued (by slurmrt, by a preemption): the guard stays pending; the next run cancels it and arms its
  own (the ``guard`` events of the event log name the guards).
- The job ends otherwise (FAILED, CANCELLED, TIMEOUT): the guard runs, and requeues the job only on evidence that
  its batch node failed and that the job was to go on: the batch node left the job's ``NodeList`` (Slurm takes a
  failed node out of a ``--no-kill`` job), the job's ``Restarts`` is still the run that armed the guard, and that
  run's last step did not end for good (no ``exit`` event, or one that asked for an in-job restart or a requeue).
  The recovery plan then decides as for any lost node (the loop guard and ``max_restarts`` have their say), and the
  executor requeues the job without the node and writes it into the user's bad-node ledger.

A guard that cannot be submitted (no sbatch, a submission limit) costs a warning, and the job runs as without it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import _slurm
from ..launch.slurmvars import Job, this_node
from ..record.events import Event, EventLog, read_events
from ..record.ledger import Ledger
from ..record.runs import Run, runs_of
from .exclusion import JobNodes, read_job
from .executor import Executor
from .facts import Facts
from .plan import Action, Trigger

__all__ = ["arm", "batch_host", "judge", "stand_guard"]

logger = logging.getLogger(__name__)

#: The guard's time limit, in minutes: it reads the job and the event log, and requeues (seconds).
TIME_LIMIT_MIN = 5
#: Job states in which the job still lives: the guard has nothing to do.
_LIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "SUSPENDED",
         "RESIZING", "SIGNALING", "STAGE_OUT"}


def batch_host(env: Mapping[str, str]) -> str:
    """The node this process runs on, as Slurm names it."""
    return this_node(env)


def arm(slurm_job: Job, host: str, *, events: EventLog, output: str | None, nodes: int | None = None,
        run_dir: Path | None = None) -> str | None:
    """Cancel the guards earlier runs of ``slurm_job`` armed, submit this run's, where the job runs (its partition,
    account and QOS); returns its job id (None: not armed, and why was said). ``output``: the job's output file (the
    guard appends to it), else none; ``run_dir``: ``slurmrt run``'s directory, where the guard reads the options the
    training resolved (its event log, its limits), as ``slurmrt run`` does."""
    job, restart = slurm_job.requeue_id, slurm_job.restart_count
    for earlier in armed(events.path, job):
        _slurm.run("scancel", earlier)  # pending (its job was requeued): this run's replaces it
    command = [sys.executable, "-m", "slurmrt", "guard", job, "--restart", str(restart), "--batch-host", host,
               *(["--nodes", str(nodes)] if nodes else []), *(["--run-dir", str(run_dir)] if run_dir else [])]
    # --export=ALL: the guard needs this environment (the job's SLURMRT_* options, PYTHONPATH), whatever a site's
    # SBATCH_EXPORT says.
    args = ["--parsable", f"--dependency=afternotok:{job}", "--kill-on-invalid-dep=yes", "--nodes=1", "--ntasks=1",
            f"--job-name=slurmrt-guard-{job}", f"--time={TIME_LIMIT_MIN}", "--export=ALL", "--open-mode=append",
            f"--output={output or '/dev/null'}"]
    args += slurm_job.placement_options()
    out = _slurm.run("sbatch", *args, "--wrap", shlex.join(command))
    if isinstance(out, str):
        guard, said = None, out
    elif out.returncode != 0:
        guard, said = None, f"sbatch refused it (exit {out.returncode}): {out.stderr.strip()}"
    else:
        guard, said = out.stdout.strip().split(";")[0] or None, "sbatch printed no job id"
    if guard is None:
        message = (f"no guard job ({said}): if node {host}, the batch script's, fails, Slurm ends the job without a "
                   "requeue")
        logger.warning("%s", message)
        events.emit(Event.GUARD, guard=None, batch_host=host, message=message)
        return None
    events.emit(Event.GUARD, guard=guard, batch_host=host,
                message=f"guard job {guard} requeues job {job} if node {host} fails")
    return guard


def armed(path: Path | None, job: str) -> list[str]:
    """The guard jobs that ``slurmrt run`` armed for ``job`` (the event log's ``guard`` events)."""
    # Shape: read a file another process wrote: each way it can be absent or wrong ends with nothing armed
    if path is None or not path.exists():
        return []
    try:
        found = [e.get("guard") for e in read_events(path, own=True) if e.get("event") == Event.GUARD.value
                 and e.get("job") == job and e.get("rank") == -1]
    except OSError:
        return []
    return [g for g in dict.fromkeys(found) if isinstance(g, str) and g.replace("_", "").isdigit()]


#: A node in one of these states has failed (``scontrol show node``: ``DOWN*``, ``IDLE+NOT_RESPONDING``, ...).
_FAILED_NODE = ("DOWN", "FAIL", "NOT_RESPONDING")


def judge(info: JobNodes, *, restart: int, host: str, answered: bool, host_state: str | None = None) -> str | None:
    """Why the guard leaves the job alone, or None: requeue it. The evidence that the batch node failed: it left
    the job's NodeList (what Slurm 22.05 does), the job ended NODE_FAIL, or the node is down now (``host_state``)."""
    # Shape: one reason to leave the job alone per line, in the order the evidence is read; None requeues
    if info.state is None or info.state.split("+")[0] in _LIVE:
        return f"the job is {info.state or 'in no known state'}: nothing to do"
    if info.restarts is not None and info.restarts != restart:
        return f"the job was requeued after run {restart} (Restarts={info.restarts}): that run's guard is not needed"
    if not _failed(info, host, host_state):
        return (f"its batch node {host} did not leave the job (NodeList={','.join(info.nodes or ()) or '?'}) and is "
                f"not down (State={host_state or '?'}): not a node failure; the job ended as slurmrt in it chose, "
                "or was ended")
    if answered:
        return f"run {restart} had ended for good (its exit event) before {host} failed: that answer stands"
    return None


def stand_guard(job: str, restart: int, host: str, *, facts: Facts, event_log: Callable[[int], EventLog],
                ledger: Ledger | None) -> int:
    """The guard's work, once its job ended not COMPLETED: requeue it without ``host`` when :func:`judge` says so.
    ``event_log``: the job's event log for a step (by attempt). Returns 0 (nothing to do, or done) or the plan's exit
    code when it refused."""
    info = read_job(job)
    if isinstance(info, str):
        print(f"slurmrt guard: job {job}: cannot tell ({info}); leaving it", file=sys.stderr)
        return 1
    run_, attempt = _last_step(event_log(0).path, restart)
    ended = run_.exit if run_ is not None else None
    # A run that ended for good (its exit event's action: finished, stopped, failed) stands; one that wanted the job
    # to go on (a requeue, an in-job restart) was stopped by the lost batch node.
    action = Action.of(ended.get("action")) if ended is not None else None
    refused = judge(info, restart=restart, host=host, answered=action is not None and action.for_good,
                    host_state=node_state(host))
    if refused is not None:
        print(f"slurmrt guard: job {job}: {refused}", file=sys.stderr)
        return 0
    why = f"node {host}, the batch script's, failed and Slurm ended job {job} (JobState={info.state})"
    print(f"slurmrt guard: job {job}: {why}: asking the recovery plan", file=sys.stderr)
    done = Executor(dataclasses.replace(facts, in_job=None), event_log(attempt), node=None, ledger=ledger).recover(
        Trigger.NODE_GONE, nodes=[host], ask=False, detail=why, by="guard")
    print(f"slurmrt guard: job {job}: {done.why}", file=sys.stderr)
    return 0 if done.restarts else done.code


def _failed(info: JobNodes, host: str, host_state: str | None) -> bool:
    left = info.nodes is not None and host not in info.nodes
    down = (info.state or "").startswith("NODE_FAIL") or any(s in (host_state or "").upper() for s in _FAILED_NODE)
    return left or down


def node_state(node: str) -> str | None:
    """``State=`` of ``scontrol show node -o NODE``; None when not known."""
    out = _slurm.run("scontrol", "show", "node", "-o", node)
    if isinstance(out, str) or out.returncode != 0:
        return None
    found = re.search(r"\bState=(\S+)", out.stdout)
    return found.group(1) if found else None


def _last_step(path: Path | None, restart: int) -> tuple[Run | None, int]:
    """Run ``restart``'s last step (its last in-job attempt) in the event log, and that attempt."""
    steps = [r for r in runs_of(path) if r.restart == restart]
    return (steps[-1], steps[-1].attempt) if steps else (None, 0)
