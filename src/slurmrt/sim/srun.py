"""The ``srun`` of ``slurmrt sim``: starts one process per task with the environment of a real step.

Each task gets its own process group, as slurmstepd gives it, so a signal reaches a task and its children (a
``bash -c`` wrapper, a launcher's workers). Signals sent to srun itself are passed to every task, which is what makes
the ``--signal=B:`` forwarding pattern (``kill -USR1 $SRUN_PID``) work. Options other than
``--kill-on-bad-exit`` are accepted and ignored: a step always spans the whole allocation here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from ..launch.health import SIM_UNHEALTHY_ENV
from .environ import task_env
from .spec import JobSpec
from .state import SimState

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGQUIT)
_WITH_VALUE = {"-N", "-n", "-c", "-w", "-p", "-o", "-e", "-J", "-t", "--nodes", "--ntasks", "--ntasks-per-node",
               "--cpus-per-task", "--nodelist", "--partition", "--output", "--error", "--job-name", "--time",
               "--gpus-per-node", "--gpus-per-task", "--mem", "--export", "--mpi", "--cpu-bind", "--distribution"}


def parse(argv: Sequence[str]) -> tuple[bool | None, list[str]]:
    """(kill-on-bad-exit if given, command)."""
    kill: bool | None = None
    i = 0
    args = list(argv)
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in {"--kill-on-bad-exit", "-K"}:
            kill = value != "0" if eq else True
        elif name in _WITH_VALUE and not eq:
            i += 1
        i += 1
    return kill, args[i:]


_Task = tuple[subprocess.Popen[bytes], int, int]  # (process, node, rank)


def main(argv: Sequence[str] | None = None) -> int:
    state = SimState.from_env()
    spec, job = state.read_job()
    kill_flag, command = parse(sys.argv[1:] if argv is None else argv)
    if not command:
        print("srun: fatal: no command to run", file=sys.stderr)
        return 2
    step = state.next_step()
    procs, forwarders = _start(spec, job, step, command)
    state.add_tasks(step, [(p.pid, node, rank) for p, node, rank in procs])

    def forward(signum: int, frame: object) -> None:
        _signal(procs, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    codes = _wait(state, spec, step, procs, spec.kill_on_bad_exit if kill_flag is None else kill_flag)
    for thread in forwarders:
        # A task's own children may keep its pipe open after it ended (a daemon): their output is not the step's.
        thread.join(1.0)
    return max(codes.values())


def _start(spec: JobSpec, job: dict[str, Any], step: int, command: list[str]
           ) -> tuple[list[_Task], list[threading.Thread]]:
    """Every task of the step, each with the threads that pass its output on."""
    procs: list[_Task] = []
    forwarders: list[threading.Thread] = []
    for rank in range(spec.ntasks):
        env = {**os.environ, **task_env(spec, job["restart"], step, rank, job["submit_dir"])}
        if spec.unhealthy_name is not None and spec.node_names[rank // spec.ntasks_per_node] == spec.unhealthy_name:
            env[SIM_UNHEALTHY_ENV] = f"slurmrt sim --unhealthy-node: {spec.unhealthy_name} is bad"
        # SLURM_TASK_PID is the task's own pid: only the task can say it, so a shell sets it and execs the command.
        p = subprocess.Popen(["/bin/sh", "-c", 'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"', "srun",
                              *command], env=env, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        procs.append((p, rank // spec.ntasks_per_node, rank))
        for pipe, target in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
            forwarders.append(threading.Thread(target=_forward_lines, args=(pipe, target), daemon=True))
            forwarders[-1].start()
    return procs, forwarders


def _signal(procs: list[_Task], signum: int) -> None:
    for p, _, _ in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signum)


def _wait(state: SimState, spec: JobSpec, step: int, procs: list[_Task], kill_on_bad_exit: bool) -> dict[int, int]:
    """Every task's exit code, as srun reports them; with --kill-on-bad-exit, the first failure kills the step."""
    codes: dict[int, int] = {}
    killed = False
    while len(codes) < len(procs):
        for p, node, rank in procs:
            if rank in codes or p.poll() is None:
                continue
            code = p.returncode
            codes[rank] = code if code >= 0 else 128 - code
            state.add_task_exit(step, rank, code)  # at once: srun itself may be killed before the step ends
            if code == 0:
                continue
            what = f"Exited with exit code {code}" if code > 0 else (signal.strsignal(-code) or f"signal {-code}")
            print(f"srun: error: {spec.node_names[node]}: task {rank}: {what}", file=sys.stderr, flush=True)
            if kill_on_bad_exit and not killed:
                killed = True
                print(f"srun: Terminating StepId={spec.job_id}.{step}", file=sys.stderr, flush=True)
                _signal(procs, signal.SIGKILL)
        time.sleep(0.02)
    return codes


_OUTPUT_LOCK = threading.Lock()


def _forward_lines(pipe: IO[bytes] | None, target: IO[bytes]) -> None:
    """Pass a task's output on whole lines at a time, as srun does: with 4 tasks printing 200 unbuffered lines each
    (PYTHONUNBUFFERED=1, where print() writes its pieces separately), real srun on the test cluster delivered all
    800 lines whole in 10 of 10 runs, while tasks sharing one pipe broke lines ("PROCIDPROCID 3")."""
    if pipe is None:
        return
    with pipe:
        for line in pipe:
            with _OUTPUT_LOCK, contextlib.suppress(OSError, ValueError):
                target.write(line)
                target.flush()


if __name__ == "__main__":
    sys.exit(main())
