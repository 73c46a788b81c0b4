"""One run of a simulated Slurm job on this machine: time limit, --signal, preemption, scancel, node failure.

Timing follows docs/slurm.md: at the time limit SIGCONT+SIGTERM to every task and to the batch shell, SIGKILL
after the kill wait; ``--signal=SIG@N`` to every task (``B:`` to the batch shell only); preemption sends the job's
``--signal`` at once (``preempt_send_user_signal``), then SIGTERM after the grace time, and requeues. Unlike Slurm,
the signal comes exactly N seconds before the end (Slurm may send it up to a minute early) and a requeued job
restarts at once (Slurm waits its credential lifetime).

Nothing outlives a run: the simulator is the child subreaper of everything it starts, and kills what is left.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from ..record.events import COPY_ENV
from ..record.ledger import LEDGER_ENV
from . import guards, processes
from .environ import batch_env
from .spec import JobSpec
from .state import ENV, SimState
from .summary import RunRecord, _Follow, _is_terminal, missed_faults
from .throttle import Throttle
from .trace import Trace

__all__ = ["SimRun"]

#: A signal storm sends each of its three signals this many times to every task.
STORM_ROUNDS = 10
#: With a trace on the training clock, rank 0 reports its step this often (seconds; slurmrt's default is 10 s,
#: which would let a fault land up to 10 s of training past its step), unless the job's environment says.
STEP_TRACE_PROGRESS_S = 1


class SimRun:
    def __init__(self, spec: JobSpec, restart: int, state: SimState, bin_dir: Path, events: Path,
                 out: IO[str], stop_signal: Callable[[], int | None], trace: Trace | None = None) -> None:
        self.spec = spec
        self.trace = trace
        self.restart = restart
        self.state = state
        self.out = out
        self.events = _Follow(events, progress=self.say if _is_terminal(out) else None)
        self.stop_signal = stop_signal
        self.record = RunRecord(restart=restart)
        submit_dir = os.getcwd()
        self.started = time.time()
        state.write_job(spec, restart, submit_dir, self.started)
        inherited = ("SLURM_", "SLURMD_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC")
        env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
        env.update(batch_env(spec, restart, submit_dir))
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env[ENV] = str(state.dir)
        env[LEDGER_ENV] = str(state.dir / "bad-nodes.json")  # a rehearsal's nodes never reach the user's ledger
        env[COPY_ENV] = str(events)  # the job's own event log stays where it is (next to its checkpoints)
        env.setdefault("SLURMRT_KILL_WAIT_S", str(spec.kill_wait_s))
        if trace is not None and trace.on_steps:  # a fault comes at the first report past its step: report often
            env.setdefault("SLURMRT_PROGRESS_S", str(STEP_TRACE_PROGRESS_S))
        script = spec.script
        if script is None:
            script = state.dir / "batch.sh"
            kill = "--kill-on-bad-exit=1" if spec.kill_on_bad_exit else "--kill-on-bad-exit=0"
            line = f"srun {kill} {shlex.join(spec.command)}"
            if spec.spare_nodes:  # the line of docs/guides/in-job.md: the supervisor is the batch shell's process
                line = (f"exec {shlex.quote(sys.executable)} -m slurmrt run --spare-nodes {spec.spare_nodes} -- "
                        f"{shlex.join(spec.command)}")
            script.write_text(f"#!/bin/bash\n{line}\n")
        self.env = env
        self.batch = psutil.Popen(["bash", str(script)], env=env, start_new_session=True)
        processes.keep(self.batch.pid)
        self._throttle = Throttle(spec, state) if spec.slow_name is not None else None

    def say(self, text: str) -> None:
        print(f"slurmrt sim: {text}", file=self.out, flush=True)

    def elapsed(self) -> float:
        return time.time() - self.started

    def tasks(self, node: int | None = None) -> list[int]:
        return [pid for pid, n, _ in self.state.tasks() if node is None or n == node]

    def signal_tasks(self, sig: signal.Signals, node: int | None = None) -> None:
        for pid in self.tasks(node):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def signal_batch(self, sig: signal.Signals, *, group: bool = False) -> None:
        """The batch shell alone (``--signal=B:``: its srun children must not see it), or its whole process group
        (the end of the job)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            (os.killpg if group else os.kill)(self.batch.pid, sig)

    def terminate(self, why: str) -> None:
        """Slurm's ending of a job: SIGCONT+SIGTERM to the tasks and the batch shell, SIGKILL after the kill wait."""
        if self._throttle is not None:
            self._throttle.stop()
        self.record.ended_by = self.record.ended_by or why
        for sig in (signal.SIGCONT, signal.SIGTERM):
            self.signal_tasks(sig)
            self.signal_batch(sig, group=True)
        deadline = time.time() + self.spec.kill_wait_s
        while time.time() < deadline and processes.descendants():
            processes.reap()
            time.sleep(0.05)
        self.kill_all()

    def kill_all(self) -> None:
        killed = set()
        for proc in processes.descendants():
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.add(proc.pid)
        self.state.record_killed(killed)  # srun died with its tasks: it cannot say how they ended
        with contextlib.suppress(psutil.TimeoutExpired):
            self.batch.wait(5)
        processes.reap()

    def _schedule(self) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
        """(what happens at a time since the run started: the --signal warning, the time limit; the faults a user
        rehearses, counted from the start, or from the run's first checkpoint with --after-checkpoint: then they
        certainly hit a job that is running, however fast or slow the machine)."""
        spec = self.spec
        timeline: list[tuple[float, str]] = []
        if spec.time_s is not None:
            timeline.append((spec.time_s, "time"))
            if spec.signal is not None:
                timeline.append((max(0.0, spec.time_s - spec.signal_lead_s), "signal"))
        faults: list[tuple[float, str]] = []
        if self.restart == 0:
            if spec.preempt_at_s is not None:
                faults += [(spec.preempt_at_s, "preempt"), (spec.preempt_at_s + spec.grace_s, "preempt_term")]
            if spec.cancel_at_s is not None:
                faults.append((spec.cancel_at_s, "cancel"))
            if spec.fail_at_s is not None:
                faults += [(spec.fail_at_s, what) for what, given in (("fail", spec.fail_node),
                                                                       ("hang", spec.hang_task)) if given is not None]
        return timeline, faults + (self.trace.schedule() if self.trace is not None else [])

    def _requests(self) -> bool:
        """Act on what came from outside the job's schedule (the simulator's own signal, the job's `scontrol
        requeue`, its `scancel`); True when the run ends."""
        spec = self.spec
        signum = self.stop_signal()
        if signum is not None:
            self.say(f"slurmrt sim got {signal.Signals(signum).name}: ending job {spec.job_id} as scancel would")
            self.terminate(f"sim ended by {signal.Signals(signum).name}")
            return True
        if self.state.requested("requeue"):
            self.say(f"job {spec.job_id} asked to be requeued: ending this run")
            self.record.requeued = True
            # Slurm answers `scontrol requeue` before it kills the job; give the caller that moment too.
            deadline = time.time() + 1.0
            while time.time() < deadline and self.batch.poll() is None:
                time.sleep(0.02)
            if self.batch.poll() is None:
                self.terminate("requeued by the job")
            self.record.ended_by = self.record.ended_by or "requeued by the job"
            return True
        if self.state.requested("cancel"):
            self.say(f"scancel {spec.job_id}")
            self.terminate("scancel")
            return True
        return False

    def run(self) -> RunRecord:
        timeline, faults = self._schedule()
        # With --after-checkpoint, a fault trace's clock runs from each run's first checkpoint: training time.
        anchored = not self.spec.after_checkpoint
        self._timeline = sorted(timeline + faults) if anchored else sorted(timeline)
        self._fired: set[str] = set()
        self._fault_starts = 0  # the job's starts when a fault on the training clock last came
        try:
            anchored = self._loop(faults, anchored)
        finally:
            if not anchored:  # the job's clock never started in this run
                self.record.anchor_s = None
            self.record.missed = missed_faults([f for f in faults if not f[1].startswith("fault:")], self._fired,
                                               anchored=anchored)
        return self._ended()

    def _loop(self, faults: list[tuple[float, str]], anchored: bool) -> bool:
        # Shape: the simulator's event loop: one poll of each source per turn, in a fixed order
        while self.batch.poll() is None:
            self.events.poll()
            if not anchored and self.events.saved(self.restart):
                anchored = True
                self.record.anchor_s = self.elapsed()
                if faults:
                    self.say(f"first checkpoint of run {self.restart} committed: the rehearsed faults count from now")
                self._timeline = sorted(self._timeline + [(self.elapsed() + t, what) for t, what in faults])
            if self._requests():
                break
            self._on_steps()
            while self._timeline and self.elapsed() >= self._timeline[0][0]:
                what = self._timeline.pop(0)[1]
                self._fired.add(what)
                self.act(what)
            if self.record.ended_by and self.batch.poll() is not None:
                break
            processes.reap()
            time.sleep(0.02)
        return anchored

    def _on_steps(self) -> None:
        """A fault on the training clock whose step rank 0's newest report reached, once the job started again
        after the fault before it (a dying step's last report starts nothing)."""
        starts, step = self.events.training(self.restart)
        action = self.trace.due(step) if self.trace is not None and step is not None \
            and starts > self._fault_starts else None
        if action is not None:
            self._fault_starts = starts
            self._fired.add(action)
            self.act(action)

    def _ended(self) -> RunRecord:
        # Shape: how Slurm would name the run's end, from the facts in the order Slurm weighs them
        if self._throttle is not None:
            self._throttle.stop()
        self.record.exit_code = self.batch.poll()
        self.events.poll(final=True)  # what the run wrote since the last poll
        self.kill_all()
        self.record.task_codes = self.state.task_exits()
        processes.release(self.batch.pid)
        # The batch script may ask for the requeue and exit between two polls above (after a node failure, say):
        # the request counts all the same.
        requeue_asked = self.state.requested("requeue")
        if self.record.ended_by == "preemption" and self.record.exit_code == 0 and not requeue_asked \
                and not self.record.requeued:  # done before the grace time ended: Slurm says COMPLETED
            self.record.ended_by = ""
        if not self.record.ended_by:
            self.record.ended_by = "requeued by the job" if requeue_asked else \
                "finished" if self.record.exit_code == 0 else f"exit {self.record.exit_code}"
        self.record.requeued = self.record.requeued or requeue_asked
        self.record.seconds = self.elapsed()
        if self.stop_signal() is None:  # the job ended: its guard jobs run, unless it was requeued
            guards.after(self.record, self.state, self.env, self.out)
        return self.record

    def act(self, what: str) -> None:
        """Do what the schedule says now: a signal, the time limit, a preemption, scancel, a hang, a node failure."""
        # Shape: a dispatch on the scheduled action, one line of Slurm's behaviour each
        spec = self.spec
        if what == "signal" and spec.signal is not None:
            where = "the batch shell" if spec.signal_batch else "every task"
            self.say(f"--signal: {spec.signal.name} to {where}, {spec.signal_lead_s:.0f} s before the time limit")
            (self.signal_batch if spec.signal_batch else self.signal_tasks)(spec.signal)
        elif what == "time":
            self.say(f"*** JOB {spec.job_id} CANCELLED DUE TO TIME LIMIT ***")
            self.terminate("time limit")
        elif what in ("preempt", "preempt_term"):
            self.preempt(what == "preempt_term")
        elif what == "cancel":
            self.say(f"scancel {spec.job_id}")
            self.terminate("scancel")
        elif what == "hang":
            self.freeze()
        elif what == "fail":
            self.fail_node(spec.fail_node or 0)
        elif what.startswith("fault:"):
            self._traced(int(what[6:]))

    def _traced(self, index: int) -> None:
        """Fault ``index`` of the trace; what it schedules after it (a preemption's SIGTERM, or itself again when
        no task was alive yet) goes into the timeline."""
        later = self.trace.inject(index, self) if self.trace is not None else None
        if later is not None:
            self._timeline = sorted([*self._timeline, (self.elapsed() + later[0], later[1])])

    def preempt(self, term: bool) -> None:
        """A preemption: the job's --signal at once (preempt_send_user_signal), SIGTERM after the grace time."""
        spec = self.spec
        if term:
            self.terminate("preemption")
            self.record.requeued = spec.requeue
            return
        self.say(f"job {spec.job_id} preempted: grace time {spec.grace_s:.0f} s")
        self.record.ended_by = "preemption"
        if spec.signal is not None:
            (self.signal_batch if spec.signal_batch else self.signal_tasks)(spec.signal)

    def storm(self) -> None:
        """A signal storm: SIGUSR1, SIGUSR2 and SIGTERM to every task, STORM_ROUNDS times, as fast as they go."""
        self.say(f"a signal storm: {3 * STORM_ROUNDS} signals (USR1, USR2, TERM) to every task")
        for _ in range(STORM_ROUNDS):
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
                self.signal_tasks(sig)

    def freeze(self, task: int | None = None) -> None:
        spec = self.spec
        task = spec.hang_task if task is None else task
        for pid, node, rank in self.state.tasks():
            if rank == task:
                self.say(f"task {rank} on {spec.node_names[node]} hangs: SIGSTOP (slurmrt's watchdog should "
                         "find it; the floor is SLURMRT_HANG_FLOOR_S)")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGSTOP)

    def fail_node(self, node: int) -> None:
        spec = self.spec
        name = spec.node_names[node]
        if spec.no_kill and node > 0:  # the job keeps the nodes it still holds; the node leaves its NodeList
            self.say(f"node {name} fails: SIGKILL to its tasks; --no-kill: the job goes on without it")
            self.state.mark_down(name)
            self.signal_tasks(signal.SIGKILL, node)
            return
        self.signal_tasks(signal.SIGKILL, node)
        self.record.ended_by = self.record.ended_by or f"node {name} failed"
        if spec.no_kill:  # measured (docs/slurm.md): the job ends FAILED, not requeued, the node out of its NodeList
            self.say(f"node {name} fails: the batch script's node; --no-kill: Slurm kills the batch step and ends "
                     "the job, without a requeue")
            self.state.mark_down(name)
            self.signal_batch(signal.SIGKILL, group=True)
            return
        self.say(f"node {name} fails: SIGKILL to its tasks")
        self.record.requeued = self.record.requeued or spec.requeue  # Slurm requeues a NODE_FAIL'd job itself
