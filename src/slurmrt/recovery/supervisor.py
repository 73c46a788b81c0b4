"""``slurmrt run``: the batch script's one line, which runs the training step and replaces it in the job when it fails.

The job is allocated with spare nodes and ``--no-kill`` (``#SBATCH --nodes=3 --no-kill``), and the script says
``slurmrt run --spare-nodes 1 -- python train.py``. The supervisor runs in the batch shell:

1. It starts the training as an ``srun`` step on all but the spare nodes, ``--kill-on-bad-exit=1`` (a rank that
   exits non-zero ends the step), and tells the step's processes how to ask for a restart (:mod:`..recovery.injob`).
2. Slurm's warning signals (``--signal=B:USR1@120``) reach the batch shell only; the supervisor passes them, with the
   job's end time asked of Slurm here, to the step's rank 0 through a file in its directory (:mod:`.forward`,
   :mod:`.word`): never to a launcher (torchrun dies of SIGUSR1), and inside a container without Slurm's commands
   too.
3. When the step ends, a request left by its processes (slurmrt named bad nodes and chose an in-job restart) starts
   a new step without those nodes, in the same job: same job id, same run of the experiment, the event log goes on
   with the step's ``attempt``. A node that left the job (nobody in the step could ask) goes to the recovery plan
   here: a new step on a spare, else the requeue. Anything else ends the supervisor with the step's exit code: a
   requeue, a stop, the end, and every failure that slurmrt answered with its requeue (spares used up, the limit,
   the loop guard).

SIGTERM or SIGINT to the supervisor (scancel, the time limit: Slurm signals the steps itself) means no new step.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .._errors import ConfigError
from .._safefs import private_dir
from ..launch import hostlist
from ..launch.slurmvars import Job
from ..record.events import EventLog
from ..record.ledger import Ledger
from ..record.runs import run_of
from . import exclusion, injob
from .answered import misconfigured_tasks, recorded_code
from .evidence import Evidence
from .executor import Executor
from .facts import ATTEMPT_ENV, DIR_ENV, Facts, InJob, Spares
from .forward import Forwarder
from .plan import Action, Decision, FaultClass, Trigger, fault_outcome, in_job_refused
from .policy import ExitCode, Outcome
from .report import Failure, block, recorded
from .steps import (
    STEP_WAIT_S,
    Placement,
    default_directory,
    place,
    srun_command,
    step_code,
    under_batch_shell,
)
from .tasks import StepOutput

__all__ = ["STEP_WAIT_S", "Placement", "Supervisor", "default_directory", "place", "srun_command", "under_batch_shell"]


@dataclass
class Supervisor:
    command: list[str]
    spare_nodes: int
    max_in_job_restarts: int
    env: dict[str, str]
    #: Where the step's processes leave a request: created here, 0700, on a filesystem every node sees.
    directory: Path
    #: The Slurm job, as ``slurmrt run`` read it once from its variables (:func:`~slurmrt.launch.slurmvars.job_of`);
    #: None outside a job, which is refused here.
    slurm_job: Job | None
    srun_args: list[str] = field(default_factory=list)
    forward: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2)
    srun: str = "srun"
    #: ``srun --wait`` of the training step (0: srun's own, no limit).
    wait_s: int = STEP_WAIT_S
    #: What the recovery plan weighs besides the step's own spares and attempt (``slurmrt run`` resolves them from
    #: the job's options); None: the defaults.
    facts: Facts | None = None
    #: The user's bad-node ledger: its nodes are last-resort spares, and recovery writes the nodes it leaves out.
    ledger: Ledger | None = None
    #: The job's event log for a step (by attempt); by default none.
    event_log: Callable[[int], EventLog] = lambda attempt: EventLog(None, job=None, restart=0, rank=-1)
    #: How often the job's times are asked of Slurm again for the step's word (the job's ``end_time_refresh_s``).
    refresh_s: float = 900.0
    _terminating: bool = False
    #: The step that failed last and why (said when its replacement starts).
    _failure: Failure | None = None
    #: How the training's options differ from the environment's, as last said (said again only when it changes).
    _said_differ: str = ""
    #: Gathers the evidence of each fault (the suspects' health, checked from outside; their hangs so far).
    evidence: Evidence | None = None

    def __post_init__(self) -> None:
        job = self.slurm_job
        if job is None or not job.nodes:
            raise ConfigError("slurmrt run starts steps of a Slurm job: run it in an sbatch script (no SLURM_JOB_ID "
                              "or SLURM_JOB_NODELIST here)")
        self.job = job.id
        self.requeue_id = job.requeue_id  #: the id to requeue, and the event log's (``ARRAY_TASK`` in an array)
        self.allocation = list(job.nodes)
        self.wanted = len(self.allocation) - self.spare_nodes
        if self.spare_nodes < 0:
            raise ConfigError(f"--spare-nodes {self.spare_nodes}: a number of nodes held back, 0 or more")
        if self.wanted < 1:
            raise ConfigError(f"--spare-nodes {self.spare_nodes} with {len(self.allocation)} node(s) in the job "
                              f"({hostlist.compress(self.allocation)}): at least one node must train. Allocate "
                              f"{max(self.spare_nodes, 0) + 1} or more (#SBATCH --nodes)")
        self.per_node = job.tasks_per_node
        self.restart_count = job.restart_count
        if self.evidence is None:
            self.evidence = Evidence(self.srun, self.job, self.env)
        self.forwarder = Forwarder(self.job, self.directory, self._say, refresh_s=self.refresh_s)

    def run(self) -> int:
        if under_batch_shell(os.getppid()):
            self._say("not the batch script's own process: a --signal=B:... warning goes to the batch shell only, "
                      "which dies of it (and ends the job) before slurmrt run could pass it on. Start it with exec: "
                      "`exec slurmrt run ...` as the script's last line")
        private_dir(self.directory)
        injob.clear_records(self.directory)  # left by a supervisor that was killed: not this run's
        self.forwarder.start()
        previous = {s: signal.signal(s, self._on_signal) for s in (*self.forward, signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.forwarder.stop()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _loop(self) -> int:
        excluded: list[str] = []
        attempt = 0
        while True:
            held = set(self._allocated())  # a spare that failed meanwhile has left the job (--no-kill)
            avoid = self.ledger.nodes() if self.ledger is not None else []
            placement = place([n for n in self.allocation if n in held], excluded, self.wanted, avoid=avoid)
            self._say_avoided(placement, avoid)
            if placement is None:  # a spare failed after the ranks counted it: the requeue they left to us
                self._say(f"no {self.wanted} node(s) left in the job without {', '.join(excluded)}: requeueing it")
                done = self._executor(attempt, ()).recover(Trigger.NODE_GONE, nodes=excluded, ask=False,
                                                           detail="no spare node left to start a step on")
                return done.code
            code = self._step_once(placement, attempt)
            self._learn(attempt)
            bad, code = self._bad_nodes(placement, attempt, code)
            if bad is None or self._terminating:
                self._say(f"step {attempt} ended with exit code {code}" +
                          ("; stopping (SIGTERM/SIGINT)" if bad is not None else ""))
                return code
            excluded += bad
            attempt += 1

    def _bad_nodes(self, placement: Placement, attempt: int, code: int) -> tuple[list[str] | None, int]:
        """The nodes the next step must leave out (an empty list: a new step on the same nodes; None: no next step),
        and the exit code so far. A request from the step's ranks names suspects, which are judged here from
        evidence; else, when a rank recorded how its run ends (it finished, or requeued the job, before a late
        signal or a lost node killed the step), that answer and its code stand; else the nodes that left the
        allocation (with --no-kill, Slurm kills the step's tasks at once, so nobody could ask), or, for tasks killed
        with no node gone and nobody asking, every node of the step, are judged the same way."""
        # Shape: the sources of an answer in order of authority: the ranks' request, their exit event, Slurm's node list
        ask = injob.read_request(self.directory, attempt)
        if ask is not None:
            return self._asked(ask, placement, attempt, code)
        stands = self._standing(attempt, code)
        if stands is not None:
            return None, stands
        held = self._allocated()
        gone = [n for n in placement.nodes if n not in held]
        if not gone and (not _killed(code) or self._terminating):
            return None, code  # a code the program chose itself (2, 127): another run would fail the same way
        why = f"{', '.join(gone)} left the job (node failure)" if gone else \
            f"the step ended with exit code {code} before slurmrt in it could say why (a task killed early)"
        self._failure = Failure(attempt, code, tuple(gone), why, time.time())  # said with the decision, one line
        trigger = Trigger.NODE_GONE if gone else Trigger.RANK_LOST
        return self._judge(trigger, gone or list(placement.nodes), placement, attempt, code, asked=False,
                           detail=f"{why}; the step ended with exit code {code}")

    def _asked(self, ask: dict[str, Any], placement: Placement, attempt: int, code: int
               ) -> tuple[list[str] | None, int]:
        """The step's ranks chose an in-job restart and named suspects (or none): judged from evidence, on every
        node of the step when none was named."""
        # Shape: the request's fields validated where they are used, then judged as every fault is
        named = [n for n in ask["exclude"]]
        suspects = [n for n in named if n in placement.nodes]
        raw = ask.get("trigger")
        trigger = Trigger(raw) if raw in {t.value for t in Trigger} else Trigger.HANG
        self._failure = Failure.asked(ask, attempt, code, suspects)
        if trigger not in (Trigger.HANG, Trigger.RANK_LOST):  # judged in the step: measured slow, or unhealthy
            return self._spend(trigger, suspects, placement, attempt, code, detail=str(ask.get("why") or ""))
        if named and not suspects:
            self._say(f"step {attempt} asked to leave out {named}, none of them in the step")
        return self._judge(trigger, suspects or list(placement.nodes), placement, attempt, code, asked=True,
                           detail=str(ask.get("why") or trigger.value))

    def _judge(self, trigger: Trigger, suspects: list[str], placement: Placement, attempt: int, code: int, *,
               asked: bool, detail: str) -> tuple[list[str] | None, int]:
        """Gather the evidence on ``suspects``, classify the fault, decide and record it (a ``recovery`` event):
        a new step on the same nodes for a process fault, on a spare for a node with evidence against it, else the
        requeue without it. ``asked``: the step's ranks already chose the in-job restart, and recorded it."""
        # Shape: evidence, then the decision (as asked, or planned again), then its record: the one judgement path
        assert self.evidence is not None
        held = self._allocated()
        fault, bad, evidence = self.evidence.judge(trigger, suspects, held)
        executor = self._executor(attempt, tuple(n for n in placement.spares if n in held))
        if asked and self._refused(executor, bad, judged=bool(bad)) is None:  # the ranks asked for it, and recorded it
            decision = self._as_asked(fault_outcome(trigger), fault, bad, suspects, detail)
        else:  # the plan decides with the judged nodes: a spare for each, else the requeue
            judged = trigger if not bad else Trigger.NODE_GONE if fault is FaultClass.NODE_LOST else Trigger.UNHEALTHY
            decision = executor.recover(
                judged, nodes=bad, ask=False,
                detail=f"{detail}; {fault.value}" + (f": {', '.join(bad)} left out" if bad else ""))
        said = recorded(self.event_log(attempt), trigger, fault, evidence, decision, placement.nodes, attempt,
                        self._failure)
        if said:
            self._say(said)
        if self._failure is not None:  # the block at the next step says what was really left out
            self._failure = dataclasses.replace(self._failure, nodes=tuple(bad), fault=fault.value)
        if decision.action is Action.IN_JOB_RESTART:
            return list(bad), code
        return None, decision.code  # the executor said why, and what it did instead

    def _spend(self, trigger: Trigger, nodes: list[str], placement: Placement, attempt: int, code: int, *,
               detail: str) -> tuple[list[str] | None, int]:
        """Nodes the step's ranks judged themselves (a straggler measured slow, a node that failed its health
        check): a new step without them when a spare is left for each and the limit and the loop guard allow it,
        else the plan's other answer (the requeue without them), recorded."""
        executor = self._executor(attempt, tuple(n for n in placement.spares if n in self._allocated()))
        if self._refused(executor, nodes) is None:
            return nodes, code
        decision = executor.recover(trigger, nodes=nodes, ask=False, detail=detail or trigger.value)
        self._failure = None  # the executor said why, and what it did instead
        return None, decision.code

    @staticmethod
    def _refused(executor: Executor, nodes: Sequence[str], *, judged: bool = True) -> str | None:
        """Why the plan would not make the new step the ranks asked for, with the spares, the limit and the loop
        guard that only ``slurmrt run`` knows (None: it would)."""
        return in_job_refused(executor.facts.with_futile(executor.futile()), nodes, judged=judged)

    def _as_asked(self, outcome: Outcome, fault: FaultClass, bad: tuple[str, ...], suspects: list[str],
                  detail: str) -> Decision:
        """The new step the ranks asked for, without the nodes judged bad (none: the same nodes); those go into the
        bad-node ledger."""
        if bad and self.ledger is not None:
            self.ledger.record(bad, reason=f"{fault.value}: {detail}", job=self.requeue_id)
        why = f"{', '.join(bad)}: {fault.value}" if bad else \
            "a new step on the same nodes: no node evidence against " + ", ".join(suspects)
        return Decision(Action.IN_JOB_RESTART, outcome, why, bad)

    def _standing(self, attempt: int, code: int) -> int | None:
        """The exit code that stands without a recovery: ``code`` when slurmrt in the step chose it (finished,
        stopped, requeued or refused), or the code a rank recorded before a late signal or a lost node killed the
        step; None when nobody in the step answered. A requeue the step chose but was killed before it made is made
        here."""
        run = run_of(self.event_log(attempt).path, self.restart_count, attempt)
        answer = code if code in {int(c) for c in ExitCode} else recorded_code(run)
        if answer is None:
            tasks = misconfigured_tasks(self.directory, attempt)
            if not tasks:
                return None
            self._say(f"step {attempt}: task(s) {', '.join(map(str, tasks))} exited {int(ExitCode.CONFIG)}: slurmrt "
                      "found the launch or an option misconfigured (the line above says what to fix); not restarted "
                      "or requeued")
            return int(ExitCode.CONFIG)
        if answer != code:
            self._say(f"the step ended with exit code {code} after slurmrt in it had answered {answer}: "
                      "that answer stands")
        made = self._executor(attempt, ()).complete_requeue(run)  # it says so
        return made.code if made is not None else answer

    def _learn(self, attempt: int) -> None:
        """The options step ``attempt``'s training resolved at ``init()`` (``checkpoint_dir=`` in code, and the
        rest): from now on the supervisor decides with them and records in the training's own event log."""
        learned = injob.read_facts(self.directory, attempt)
        if learned is None:
            return  # killed before init(): what was learned before, else the environment, stands
        base = self.facts or Facts(job=self.requeue_id, restart_count=self.restart_count)
        facts, differ = base.learned(learned, self.event_log(attempt).path)
        if differ and differ != self._said_differ:  # once, not at every step
            self._say(f"the training's own options differ from the environment's ({differ}): its own are used")
            self._said_differ = differ
        path = Path(learned["event_log"]) if learned["event_log"] else None
        if learned["checkpoint_dir"] and self.evidence is not None:  # the health probe checks the training's own
            self.evidence.checkpoint_dir = Path(learned["checkpoint_dir"])
        self.facts = facts
        self.event_log = lambda a: EventLog.for_job(path, None, job=self.requeue_id, restart=self.restart_count,
                                                    rank=-1, env=self.env, attempt=a)

    def _executor(self, attempt: int, spares: tuple[str, ...]) -> Executor:
        """The recovery executor for step ``attempt``, whose spares still in the job are ``spares``."""
        facts = dataclasses.replace(self.facts or Facts(job=self.requeue_id, restart_count=self.restart_count),
                                    in_job=InJob(self.directory, attempt, Spares(spares, self.max_in_job_restarts)),
                                    job_nodes=len(self.allocation))
        return Executor(facts, self.event_log(attempt), node=None, ledger=self.ledger)

    def _say_avoided(self, placement: Placement | None, avoid: list[str]) -> None:
        kept = [n for n in placement.spares if n in avoid] if placement is not None else []
        if kept:
            self._say(f"{hostlist.compress(kept)}: in your bad-node ledger (`slurmrt nodes`), kept as last-resort "
                      "spare(s)")

    def _allocated(self) -> list[str]:
        """The job's nodes now (``scontrol show job``): with --no-kill, a failed node leaves the job's NodeList."""
        job = exclusion.read_job(self.job)
        if isinstance(job, str) or job.nodes is None or job.state != "RUNNING":
            return self.allocation  # unknown, or requeued or ending: nothing to tell
        return list(job.nodes)

    def _step_once(self, placement: Placement, attempt: int) -> int:
        env = dict(self.env)
        env.update({DIR_ENV: str(self.directory), ATTEMPT_ENV: str(attempt)})  # the spares stay here: one planner
        argv = srun_command(self.srun, placement, self.per_node, self.srun_args, self.command, wait_s=self.wait_s)
        if self._failure is not None and attempt > 0:
            for line in block(self._failure, attempt, self.max_in_job_restarts, placement.nodes, placement.spares):
                self._say(line)
        else:
            self._say(f"step {attempt} on {hostlist.compress(placement.nodes)}" +
                      (f", spare {hostlist.compress(placement.spares)}" if placement.spares else ", no spare left"))
        self.forwarder.running(attempt, placement)  # its word first: the job's times, a signal that came meanwhile
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        output = StepOutput(proc.stderr, sys.stderr.fileno(), self.directory, attempt,
                            len(placement.nodes) * self.per_node)
        output.start()  # srun's standard error, passed on; the tasks it saw end, told to the step's ranks at once
        try:
            return step_code(proc.wait())
        finally:
            self.forwarder.running(None)
            output.join(timeout=10)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Records, nothing more: the forwarder thread passes the signal on."""
        sig = signal.Signals(signum)
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._terminating = True
            self.forwarder.wake()
        else:
            self.forwarder.add(sig)

    def _say(self, text: str) -> None:
        print(f"slurmrt run: {text}", file=sys.stderr, flush=True)


def _killed(code: int) -> bool:
    """The step's tasks were killed by a signal: srun says 128 + N (a negative code: a signal by number). Another
    code is the program's own (2 for a usage error, 127 for a missing command)."""
    return code >= 128 or code < 0
