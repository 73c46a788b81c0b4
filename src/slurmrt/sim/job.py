"""A simulated Slurm job: its runs one after another, each placed on the nodes left after exclusions and failures,
a requeued one after Slurm's wait; the summary at the end. One run is :class:`slurmrt.sim.runner.SimRun`.

Nothing outlives the job: the simulator is the child subreaper of everything it starts, and kills what is left.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import IO

from ..launch import hostlist
from ..record.events import read_events
from . import jobids, processes
from .environ import default_node_names
from .runner import SimRun
from .shims import install
from .spec import JobSpec
from .state import SimState
from .summary import RunRecord, SimInterrupted, _annotate, ledger, summary, tidy
from .trace import Trace

__all__ = ["RunRecord", "SimInterrupted", "simulate"]


def simulate(spec: JobSpec, *, out: IO[str] = sys.stdout, state_dir: Path | None = None) -> list[RunRecord]:
    """Run the job train: the job, and each requeued run of it, until one is not requeued or max_restarts."""
    if not spec.node_names:
        spec = replace(spec, node_names=default_node_names(spec.nodes))
    if spec.unhealthy_node is not None:
        spec = replace(spec, unhealthy_name=spec.node_names[spec.unhealthy_node])
    if spec.slow_node is not None:
        spec = replace(spec, slow_name=spec.node_names[spec.slow_node])
    reservation = None
    if not spec.job_id:
        job_id, reservation = jobids.reserve()
        spec = replace(spec, job_id=job_id)
    try:
        return _simulate(spec, out, state_dir)
    finally:
        jobids.release(reservation)


def _simulate(spec: JobSpec, out: IO[str], state_dir: Path | None) -> list[RunRecord]:
    # Shape: set up, run with Slurm's signals held, tear down whatever happened, then the summary: one job's frame
    processes.become_subreaper()
    directory = state_dir or Path(tempfile.mkdtemp(prefix=f"slurmrt-sim-{spec.job_id}-"))
    state = SimState(directory)
    bin_dir = install(directory / "bin")
    events = directory / "events.jsonl"
    print(f"slurmrt sim: {spec.describe()} (state in {directory})", file=out, flush=True)
    records: list[RunRecord] = []
    trace = Trace(spec.faults, out, spec.fault_source) if spec.faults or spec.fault_source else None
    # Ctrl-C, `timeout`, a CI runner's SIGTERM, a closed terminal: the job ends as Slurm ends a cancelled one
    # (SIGTERM to the tasks, SIGKILL after the kill wait), then the simulator exits 128 + the signal.
    received: list[int] = []
    ending = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.getsignal(sig) for sig in ending}
    for sig in ending:
        signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        records = _runs(spec, state, bin_dir, events, out, received, trace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in processes.descendants():
            proc.kill()
        processes.reap()
    _annotate(records, list(read_events(events)) if events.exists() else [])
    after = (trace.lines() if trace is not None else []) + ledger(events)
    if state_dir is None:  # ours: gone after a clean end, kept (and named) to look into otherwise
        tidy(directory, records, out, interrupted=bool(received))
    print(summary(records, after), file=out, flush=True)
    if received:
        raise SimInterrupted(received[0])
    return records


def _runs(spec: JobSpec, state: SimState, bin_dir: Path, events: Path, out: IO[str], received: list[int],
          trace: Trace | None) -> list[RunRecord]:
    """The job's runs: the first, and each requeued one, until one is not requeued, the simulator is told to stop,
    or max_restarts."""
    # Shape: the requeue loop as Slurm runs it: a run, its end, the wait before the next
    records: list[RunRecord] = []
    for restart in range(spec.max_restarts + 1):
        spec = _placed(spec, state, restart, out)
        run = SimRun(spec, restart, state, bin_dir, events, out, lambda: received[0] if received else None, trace)
        record = run.run()
        records.append(record)
        if trace is not None:
            trace.ran(0.0 if record.anchor_s is None else record.seconds - record.anchor_s)
        run.say(f"run {restart} ended after {record.seconds:.1f} s: {record.ended_by}"
                f"{' -> requeued' if record.requeued else ''}")
        if not record.requeued or received:
            break
        if restart == spec.max_restarts:
            run.say(f"max restarts ({spec.max_restarts}) reached: not starting again")
        elif spec.requeue_wait_s:  # BeginTime: Slurm holds a requeued job a while, then it queues
            run.say(f"the requeued job waits {spec.requeue_wait_s:g} s before its next run")
            until = time.monotonic() + spec.requeue_wait_s
            while time.monotonic() < until and not received:
                time.sleep(0.05)
    return records


def _placed(spec: JobSpec, state: SimState, restart: int, out: IO[str]) -> JobSpec:
    """The job as the scheduler places run ``restart``: on other nodes than the excluded and the down ones."""
    excluded = state.excluded() | state.down()
    if not excluded & set(spec.node_names):
        return spec
    spare = [n for n in default_node_names(spec.nodes + len(excluded)) if n not in excluded]
    spec = replace(spec, node_names=tuple(spare[:spec.nodes]))
    print(f"slurmrt sim: {hostlist.compress(sorted(excluded))} excluded: run {restart} gets "
          f"{hostlist.compress(spec.node_names)}", file=out, flush=True)
    return spec

