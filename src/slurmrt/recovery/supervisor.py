"""``slurmrt run``: the batch script's one line, which runs the training step and replaces it in the job when it fails.

The job is allocated with spare nodes and ``--no-kill`` (``#SBATCH --nodes=3 --no-kill``), and the script says
``slurmrt run --spare-nodes 1 -- python train.py``. The supervisor runs in the batch shell:

1. It starts the training as an ``srun`` step on all but the spare nodes, ``--kill-on-bad-exit=1`` (a rank that
   exits non-zero ends the step), and tells the step's processes how to ask for a restart (:mod:`..recovery.injob`).
2. Slurm's warning signals (``--signal=B:USR1@120``) reach the batch shell only; the supervisor passes them to the
   training processes only (``slurmrt signal`` on each node of the step), never to a launcher (torchrun dies of
   SIGUSR1).
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
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from .._errors import ConfigError
from .._safefs import private_dir
from ..launch import hostlist
from ..record.events import Event, EventLog, Run, runs_of
from ..record.ledger import Ledger
from . import exclusion, injob
from .executor import Executor
from .facts import ATTEMPT_ENV, DIR_ENV, MAX_ENV, SPARES_ENV, Facts, InJob
from .plan import Action, Trigger
from .policy import ExitCode
from .report import Failure, block

__all__ = ["Placement", "Supervisor", "place", "srun_command", "tasks_per_node"]


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]
    spares: tuple[str, ...]


def place(allocation: Sequence[str], excluded: Sequence[str], wanted: int, *,
          avoid: Sequence[str] = ()) -> Placement | None:
    """The step's ``wanted`` nodes, in the allocation's order, and the spares left; None when too few remain. Nodes
    to ``avoid`` (the user's bad-node ledger) come last: the step gets them only when nothing else is left."""
    usable = [n for n in allocation if n not in set(excluded)]
    usable = [n for n in usable if n not in set(avoid)] + [n for n in usable if n in set(avoid)]
    if len(usable) < wanted:
        return None
    return Placement(tuple(usable[:wanted]), tuple(usable[wanted:]))


_TASKS = re.compile(r"(\d+)(?:\(x\d+\))?")


def tasks_per_node(env: Mapping[str, str]) -> int:
    """Tasks per node as the job asked (``--ntasks-per-node``, or the first count of ``SLURM_TASKS_PER_NODE``)."""
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        raw = (env.get(name) or "").split(",")[0]
        m = _TASKS.fullmatch(raw)
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return 1


#: ``srun --wait``: the step's tasks still running this long after one ended are ended. The ranks end together (they
#: agree on the end first), so a task still there minutes later is frozen: the cluster campaign's rank 0, stopped
#: after it had finished, kept its job for ever.
STEP_WAIT_S = 120


def srun_command(srun: str, placement: Placement, per_node: int, extra: Sequence[str],
                 command: Sequence[str], *, wait_s: int = STEP_WAIT_S) -> list[str]:
    n = len(placement.nodes)
    return [srun, "--kill-on-bad-exit=1", *([f"--wait={wait_s}"] if wait_s > 0 else []), f"--nodes={n}",
            f"--nodelist={','.join(placement.nodes)}", f"--ntasks={n * per_node}", f"--ntasks-per-node={per_node}",
            *extra, *command]


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Supervisor:
    command: list[str]
    spare_nodes: int
    max_restarts: int
    env: dict[str, str]
    #: Where the step's processes leave a request: created here, 0700, on a filesystem every node sees.
    directory: Path
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
    #: Seconds between two tries to pass a signal on while some node's training processes have not registered yet.
    retry_s: float = 2.0
    #: Tries before giving up on that (the start-up of a step: torch's import, the rendezvous).
    tries: int = 60
    _terminating: bool = False
    _step: Placement | None = None
    _proc: subprocess.Popen[bytes] | None = None
    #: Signals recorded by the handler, not yet passed on (the forwarder thread takes them while a step runs).
    _pending: list[signal.Signals] = field(default_factory=list)
    _wake: threading.Event = field(default_factory=threading.Event)
    _done: bool = False
    #: The step that failed last and why (said when its replacement starts).
    _failure: Failure | None = None

    def __post_init__(self) -> None:
        job = self.env.get("SLURM_JOB_ID")
        raw = self.env.get("SLURM_JOB_NODELIST") or self.env.get("SLURM_NODELIST")
        if not job or not raw:
            raise ConfigError("slurmrt run starts steps of a Slurm job: run it in an sbatch script (no SLURM_JOB_ID "
                              "or SLURM_JOB_NODELIST here)")
        self.job = job
        self.allocation = hostlist.expand(raw)
        self.wanted = len(self.allocation) - self.spare_nodes
        if self.spare_nodes < 0 or self.wanted < 1:
            raise ConfigError(f"--spare-nodes {self.spare_nodes} with {len(self.allocation)} node(s) in the job "
                              f"({hostlist.compress(self.allocation)}): at least one node must train. Allocate "
                              f"{max(self.spare_nodes, 0) + 1} or more (#SBATCH --nodes)")
        self.per_node = tasks_per_node(self.env)
        raw_restarts = self.env.get("SLURM_RESTART_COUNT") or "0"
        self.restart_count = int(raw_restarts) if raw_restarts.isdigit() else 0

    def run(self) -> int:
        if under_batch_shell(os.getppid()):
            self._say("not the batch script's own process: a --signal=B:... warning goes to the batch shell only, "
                      "which dies of it (and ends the job) before slurmrt run could pass it on. Start it with exec: "
                      "`exec slurmrt run ...` as the script's last line")
        private_dir(self.directory)
        for stale in self.directory.glob("request-*.json"):  # left by a supervisor that was killed: not this run's
            stale.unlink()
        forwarder = threading.Thread(target=self._forwarder, name="slurmrt-forward", daemon=True)
        forwarder.start()
        previous = {s: signal.signal(s, self._on_signal) for s in (*self.forward, signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._done = True
            self._wake.set()
            forwarder.join(timeout=130)  # a signal being passed on: its srun finishes (bounded by its own timeout)
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
            bad, code = self._bad_nodes(placement, attempt, code)
            if not bad or self._terminating:
                self._say(f"step {attempt} ended with exit code {code}" +
                          ("; stopping (SIGTERM/SIGINT)" if bad else ""))
                return code
            excluded += bad
            attempt += 1

    def _bad_nodes(self, placement: Placement, attempt: int, code: int) -> tuple[list[str], int]:
        """The nodes the next step must leave out (none: no next step), and the exit code so far. Those the step's
        ranks asked for; else, when a rank recorded how its run ends (it finished, or requeued the job, before a
        late signal or a lost node killed the step), that answer and its code: a finished training stays finished;
        else those that left the allocation (a node failure: with --no-kill, Slurm kills the
        step's tasks at once, so nobody could ask), for which the supervisor asks the recovery plan itself: a new
        step on a spare, or the requeue without them."""
        asked = self._asked(placement, attempt, code)
        if asked is not None:
            return asked, code
        stands = self._standing(attempt, code)
        if stands is not None:
            return [], stands
        held = self._allocated()
        gone = [n for n in placement.nodes if n not in held]
        if not gone:
            return [], self._unanswered(attempt, code) if _killed(code) and not self._terminating else code
        why = f"{', '.join(gone)} left the job (node failure)"
        self._failure = Failure(attempt, code, tuple(gone), why, time.time())
        self._say(why)
        spares = tuple(n for n in placement.spares if n in held)
        done = self._executor(attempt, spares).recover(
            Trigger.NODE_GONE, nodes=gone, ask=False,
            detail=f"{', '.join(gone)} left the job (node failure); the step ended with exit code {code}")
        if done.action is Action.IN_JOB_RESTART:
            return gone, code
        return [], done.code  # the executor said why, and what it did instead

    def _unanswered(self, attempt: int, code: int) -> int:
        """A step whose tasks a signal killed, no node gone, nobody asking and no rank's answer recorded: killed
        before slurmrt in it could answer (during its start-up, by the OOM killer, all at once). The requeue answers
        it (the loop guard has its say), with no node named, since nothing points at one. A code the program chose
        itself (2 for a usage error, 127 for a missing command) still ends the job: another run would fail the
        same way."""
        why = f"the step ended with exit code {code} before slurmrt in it could say why (a task killed early)"
        self._failure = Failure(attempt, code, (), why, time.time())
        self._say(why)
        return self._executor(attempt, ()).recover(Trigger.RANK_LOST, ask=False, detail=why).code

    def _standing(self, attempt: int, code: int) -> int | None:
        """The exit code that stands without a recovery: ``code`` when slurmrt in the step chose it (finished,
        stopped, requeued or refused), or the code a rank recorded before a late signal or a lost node killed the
        step; None when nobody in the step answered. A requeue the step chose but was killed before it made is made
        here."""
        run = self._run(attempt)
        answer = code if code in {int(c) for c in ExitCode} else self._answer(run)
        if answer is None:
            return None
        if answer != code:
            self._say(f"the step ended with exit code {code} after slurmrt in it had answered {answer}: "
                      "that answer stands")
        made = self._executor(attempt, ()).complete_requeue(run)  # it says so
        return made.code if made is not None else answer

    def _run(self, attempt: int) -> Run | None:
        """Step ``attempt`` of this run, as the event log tells it (rank 0's and the leading rank's events)."""
        return next((r for r in runs_of(self.event_log(attempt).path)
                     if r.restart == self.restart_count and r.attempt == attempt), None)

    @staticmethod
    def _answer(run: Run | None) -> int | None:
        """The exit code slurmrt in the step recorded for its run (the run's exit event), or None."""
        exit_event = run.first(Event.EXIT) if run is not None else None
        code = exit_event.get("code") if exit_event else None
        return code if isinstance(code, int) and not isinstance(code, bool) else None

    def _asked(self, placement: Placement, attempt: int, code: int) -> list[str] | None:
        """The nodes the step's ranks asked to leave out (the plan chose an in-job restart there); None: no
        request."""
        ask = injob.read_request(self.directory, attempt)
        if ask is None:
            return None
        bad = [n for n in ask["exclude"] if n in placement.nodes]
        self._failure = Failure.asked(ask, attempt, code, bad)
        if not bad:
            self._say(f"step {attempt} asked to leave out {ask['exclude']}, none of them in the step")
        return bad

    def _executor(self, attempt: int, spares: tuple[str, ...]) -> Executor:
        """The recovery executor for step ``attempt``, whose spares still in the job are ``spares``."""
        facts = dataclasses.replace(self.facts or Facts(job=self.requeue_id, restart_count=self.restart_count),
                                    in_job=InJob(self.directory, attempt, spares, self.max_restarts),
                                    job_nodes=len(self.allocation))
        return Executor(facts, self.event_log(attempt), node=None, ledger=self.ledger)

    @property
    def requeue_id(self) -> str:
        """The id to requeue, and the event log's: ``ARRAY_TASK`` for a task of a job array."""
        array, task = self.env.get("SLURM_ARRAY_JOB_ID"), self.env.get("SLURM_ARRAY_TASK_ID")
        return f"{array}_{task}" if array and task else self.job

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
        env.update({DIR_ENV: str(self.directory), ATTEMPT_ENV: str(attempt), SPARES_ENV: ",".join(placement.spares),
                    MAX_ENV: str(self.max_restarts)})
        argv = srun_command(self.srun, placement, self.per_node, self.srun_args, self.command, wait_s=self.wait_s)
        if self._failure is not None and attempt > 0:
            for line in block(self._failure, attempt, self.max_restarts, placement.nodes, placement.spares):
                self._say(line)
        else:
            self._say(f"step {attempt} on {hostlist.compress(placement.nodes)}" +
                      (f", spare {hostlist.compress(placement.spares)}" if placement.spares else ", no spare left"))
        self._step = placement
        self._proc = subprocess.Popen(argv, env=env)
        self._wake.set()  # a signal that came between two steps goes to this one
        try:
            return _code(self._proc.wait())
        finally:
            self._proc = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Records, nothing more: the forwarder thread passes the signal on."""
        sig = signal.Signals(signum)
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._terminating = True
        else:
            self._pending.append(sig)
        self._wake.set()

    def _forwarder(self) -> None:
        """Pass each recorded signal to the step that runs (one that came between two steps: to the next one)."""
        while not self._done:
            self._wake.wait()
            self._wake.clear()
            placement, proc = self._step, self._proc
            if placement is None or proc is None or proc.poll() is not None:
                continue  # no step runs: the next step's start wakes this thread again
            while self._pending and not self._done and proc.poll() is None:
                sig = self._pending.pop(0)
                if sig not in self._pending:  # the same signal twice before it was passed: once is enough
                    self._forward(sig, placement, proc)

    def _forward(self, sig: signal.Signals, placement: Placement, proc: subprocess.Popen[bytes]) -> None:
        """``sig`` to the training processes of every node of the step, through ``slurmrt signal``; again while a
        node had none registered yet (a step still starting) and the step runs. A process signalled twice records
        the signal once."""
        n = len(placement.nodes)
        argv = [self.srun, "--overlap", f"--jobid={self.job}", f"--nodes={n}",
                f"--nodelist={','.join(placement.nodes)}", f"--ntasks={n}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=0", sys.executable, "-m", "slurmrt", "signal", sig.name, "--job", self.job]
        for attempt in range(self.tries):
            try:
                done = subprocess.run(argv, env=self.env, check=False, timeout=120).returncode == 0
            except (OSError, subprocess.TimeoutExpired) as err:
                self._say(f"passing {sig.name} failed: {err}")
                return
            if done:
                self._say(f"{sig.name}: passed to the training processes on {hostlist.compress(placement.nodes)}")
                return
            if attempt == 0:
                self._say(f"{sig.name}: no training process registered yet on some node; trying again every "
                          f"{self.retry_s:g} s while the step runs")
            if proc.poll() is not None or self._wait(self.retry_s):
                return
        self._say(f"{sig.name}: not passed on: no training process registered after {self.tries} tries")

    def _wait(self, seconds: float) -> bool:
        """Sleep; True when the supervisor is told to stop meanwhile."""
        threading.Event().wait(seconds)
        return self._terminating

    def _say(self, text: str) -> None:
        print(f"slurmrt run: {text}", file=sys.stderr, flush=True)


def under_batch_shell(pid: int) -> bool:
    """``pid`` runs Slurm's copy of the batch script (``.../job<id>/slurm_script``): a shell that a ``B:`` signal
    reaches instead of its children."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"/slurm_script") for a in argv[:3])


def default_directory(env: Mapping[str, str], job: str) -> Path:
    """``.slurmrt-run-<job>`` in the submit directory, which every node of a cluster sees (Slurm writes the job's
    output there)."""
    base = env.get("SLURM_SUBMIT_DIR") or os.getcwd()
    return Path(base).resolve() / f".slurmrt-run-{job}"


def _killed(code: int) -> bool:
    """The step's tasks were killed by a signal: srun says 128 + N (a negative code: a signal by number). Another
    code is the program's own (2 for a usage error, 127 for a missing command)."""
    return code >= 128 or code < 0
