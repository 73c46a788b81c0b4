"""``slurmrt run``'s warning signals: passed from the batch shell to the training processes of the running step.

Slurm's warning (``--signal=B:USR1@120``) reaches the batch shell only. The supervisor's handler records it; the
forwarder thread passes it to the training processes on every node of the step that runs (``slurmrt signal`` through
``srun --overlap``), never to a launcher (torchrun dies of SIGUSR1). A signal that came between two steps goes to the
next one; a node whose training processes have not registered yet (a step still starting) is tried again while the
step runs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..launch import hostlist
from .steps import Placement

__all__ = ["Forwarder"]


@dataclass
class Forwarder:
    job: str
    env: dict[str, str]
    say: Callable[[str], None]
    srun: str = "srun"
    #: Seconds between two tries while some node's training processes have not registered yet.
    retry_s: float = 2.0
    #: Tries before giving up on that (the start-up of a step: torch's import, the rendezvous).
    tries: int = 60
    #: True once the supervisor is told to stop (SIGTERM, SIGINT): no more tries.
    terminating: Callable[[], bool] = lambda: False
    #: Signals recorded, not yet passed on.
    pending: list[signal.Signals] = field(default_factory=list)
    _wake: threading.Event = field(default_factory=threading.Event)
    _done: bool = False
    _step: Placement | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slurmrt-forward", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=130)  # a signal being passed on: its srun finishes (bounded by its timeout)

    def add(self, sig: signal.Signals) -> None:
        """Record ``sig`` (from a signal handler: nothing more)."""
        self.pending.append(sig)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def running(self, placement: Placement, proc: subprocess.Popen[bytes] | None) -> None:
        """The step that runs now (``proc`` None: none, between two steps); a signal that came meanwhile goes to it."""
        self._step, self._proc = placement, proc
        self._wake.set()

    def _run(self) -> None:
        """Pass each recorded signal to the step that runs (one that came between two steps: to the next one)."""
        while not self._done:
            self._wake.wait()
            self._wake.clear()
            placement, proc = self._step, self._proc
            if placement is None or proc is None or proc.poll() is not None:
                continue  # no step runs: the next step's start wakes this thread again
            while self.pending and not self._done and proc.poll() is None:
                sig = self.pending.pop(0)
                if sig not in self.pending:  # the same signal twice before it was passed: once is enough
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
                self.say(f"passing {sig.name} failed: {err}")
                return
            if done:
                self.say(f"{sig.name}: passed to the training processes on {hostlist.compress(placement.nodes)}")
                return
            if attempt == 0:
                self.say(f"{sig.name}: no training process registered yet on some node; trying again every "
                         f"{self.retry_s:g} s while the step runs")
            if proc.poll() is not None or self._wait(self.retry_s):
                return
        self.say(f"{sig.name}: not passed on: no training process registered after {self.tries} tries")

    def _wait(self, seconds: float) -> bool:
        """Sleep; True when the supervisor is told to stop meanwhile."""
        threading.Event().wait(seconds)
        return self.terminating()
