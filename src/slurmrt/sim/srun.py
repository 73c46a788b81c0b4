"""The ``srun`` of ``slurmrt sim``: starts one process per task with the environment of a real step.

Each task gets its own process group, as slurmstepd gives it, so a signal reaches a task and its children (a
``bash -c`` wrapper, a launcher's workers). Signals sent to srun itself are passed to every task, which is what makes
the ``--signal=B:`` forwarding pattern (``kill -USR1 $SRUN_PID``) work. A step is placed as Slurm places it in the
job: ``--nodes``, ``--nodelist``, ``--exclude``, ``--ntasks`` and ``--ntasks-per-node`` (default: every node that is
not down, with the job's tasks per node); a node that is down (``--no-kill`` after a node failure) or not in the job
is refused. ``--kill-on-bad-exit`` and ``--wait`` as in Slurm; other options are accepted and ignored.
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
from dataclasses import dataclass, field
from typing import IO, Any

from .._errors import HostlistError
from ..health.check import FLIP_ENV, REHEARSE_ENV, SPIKE_ENV
from ..launch import hostlist
from ..launch.health import SIM_UNHEALTHY_ENV
from .environ import StepLayout, task_env
from .spec import JobSpec
from .state import SimState

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGQUIT)
_WITH_VALUE = {"-c", "-p", "-o", "-e", "-J", "-t", "--nodes", "--ntasks", "--ntasks-per-node", "--exclude",
               "--cpus-per-task", "--nodelist", "--partition", "--output", "--error", "--job-name", "--time",
               "--gpus-per-node", "--gpus-per-task", "--mem", "--export", "--mpi", "--cpu-bind", "--distribution",
               "--jobid", "--wait"}


@dataclass
class StepArgs:
    """The options of one srun line that the simulator acts on; the others are accepted and ignored."""

    command: list[str]
    kill_on_bad_exit: bool | None = None
    nodes: int | None = None
    nodelist: list[str] | None = None
    exclude: list[str] = field(default_factory=list)
    ntasks: int | None = None
    per_node: int | None = None
    #: ``--wait``: seconds after the first task ended before the others are ended (0: no limit).
    wait_s: float = 0.0


_NAMES = {"-N": "--nodes", "-w": "--nodelist", "-x": "--exclude", "-n": "--ntasks", "-K": "--kill-on-bad-exit"}


def parse(argv: Sequence[str]) -> StepArgs:
    args, out = list(argv), StepArgs([])
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if len(name) > 2 and name[1] != "-" and not eq:  # -N2, -wn1
            name, eq, value = name[:2], "=", name[2:]
        name = _NAMES.get(name, name)
        if name in _WITH_VALUE and not eq and name != "--kill-on-bad-exit":
            i += 1
            value = args[i] if i < len(args) else ""
        _apply(out, name, value, given=bool(eq))
        i += 1
    out.command = args[i:]
    return out


def _apply(out: StepArgs, name: str, value: str, *, given: bool) -> None:
    """One option of the step (its long name) into ``out``; options the simulator does not model are ignored."""
    if name == "--kill-on-bad-exit":
        out.kill_on_bad_exit = value != "0" if given else True
    elif name == "--nodes":
        out.nodes = int(value.split("-")[0])
    elif name == "--nodelist":
        out.nodelist = hostlist.expand(value)
    elif name == "--exclude":
        out.exclude = hostlist.expand(value)
    elif name == "--ntasks":
        out.ntasks = int(value)
    elif name == "--ntasks-per-node":
        out.per_node = int(value)
    elif name == "--wait":
        out.wait_s = float(value)


def layout(spec: JobSpec, step: StepArgs, down: set[str]) -> StepLayout:
    """The step's nodes and tasks per node, as Slurm places them in the job; SimSrunError when it cannot."""
    nodes = _named(spec, step.nodelist, down) if step.nodelist is not None else _placed(spec, step, down)
    if not nodes:
        raise SimSrunError("Unable to create step: no usable node left in the job")
    per_node = step.per_node or (-(-step.ntasks // len(nodes)) if step.ntasks else spec.ntasks_per_node)
    return StepLayout(tuple(nodes), per_node)


def _named(spec: JobSpec, nodelist: list[str], down: set[str]) -> list[str]:
    """The nodes ``--nodelist`` names, in the job's order: each must be in the job and up."""
    foreign = [n for n in nodelist if n not in spec.node_names]
    if foreign:
        raise SimSrunError(f"Requested node configuration is not available: {','.join(foreign)} not in the job")
    gone = [n for n in nodelist if n in down]
    if gone:
        raise SimSrunError(f"Unable to create step: node(s) {','.join(gone)} are DOWN")
    return [n for n in spec.node_names if n in nodelist]


def _placed(spec: JobSpec, step: StepArgs, down: set[str]) -> list[str]:
    """The first usable nodes of the job, as many as ``--nodes`` (or the tasks) ask for."""
    nodes = [n for n in spec.node_names if n not in down and n not in step.exclude]
    wanted = step.nodes
    if wanted is None and step.ntasks is not None and step.per_node:
        wanted = -(-step.ntasks // step.per_node)
    if wanted is None:
        return nodes
    if wanted > len(nodes):
        raise SimSrunError(f"Unable to create step: {wanted} node(s) asked, {len(nodes)} usable in the job")
    return nodes[:wanted]


_Task = tuple[subprocess.Popen[bytes], int, int]  # (process, node, rank)


class SimSrunError(Exception):
    """srun cannot start the step (a node that is down or not in the job, too few nodes)."""


def main(argv: Sequence[str] | None = None) -> int:
    state = SimState.from_env()
    spec, job = state.read_job()
    try:
        step_args = parse(sys.argv[1:] if argv is None else argv)
    except (ValueError, HostlistError) as err:
        print(f"srun: error: {err}", file=sys.stderr)
        return 2
    if not step_args.command:
        print("srun: fatal: no command to run", file=sys.stderr)
        return 2
    try:
        where = layout(spec, step_args, state.down())
    except SimSrunError as err:
        print(f"srun: error: {err}", file=sys.stderr)
        return 1
    step = state.next_step()
    with state.starting():
        procs, forwarders = _start(spec, job, step, step_args.command, where)
        state.add_tasks(step, [(p.pid, node, rank) for p, node, rank in procs])

    def forward(signum: int, frame: object) -> None:
        _signal(procs, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    kill = spec.kill_on_bad_exit if step_args.kill_on_bad_exit is None else step_args.kill_on_bad_exit
    codes = _wait(state, spec, step, procs, kill, step_args.wait_s)
    for thread in forwarders:
        # A task's own children may keep its pipe open after it ended (a daemon): their output is not the step's.
        thread.join(1.0)
    return max(codes.values())


def _rehearsed(spec: JobSpec, node: str, rank: int, *, first_run: bool) -> dict[str, str]:
    """The variables that make task ``rank`` on ``node`` meet the rehearsed faults it is chosen for."""
    env = {}
    if spec.unhealthy_name is not None and node == spec.unhealthy_name:
        env[SIM_UNHEALTHY_ENV] = f"slurmrt sim --unhealthy-node: {spec.unhealthy_name} is bad"
    return {**env, **_unhealthy(spec, rank, first_run=first_run)}


def _unhealthy(spec: JobSpec, rank: int, *, first_run: bool) -> dict[str, str]:
    """The training-health faults task ``rank`` meets: a NaN (first run, or every run with ``nan_repeats``), a
    flipped bit (first run), a spike (every run: a batch that causes it)."""
    # Shape: one test per rehearsed fault: which task it strikes, and in which runs
    env = {}
    if spec.nan is not None and spec.nan[0] == rank and (first_run or spec.nan_repeats):
        env[REHEARSE_ENV] = f"{spec.nan[1]}:every" if spec.nan_repeats else str(spec.nan[1])
    if spec.flip is not None and spec.flip[0] == rank and first_run:
        env[FLIP_ENV] = str(spec.flip[1])
    if spec.spike is not None and spec.spike[0] == rank:
        env[SPIKE_ENV] = str(spec.spike[1])
    return env


def _start(spec: JobSpec, job: dict[str, Any], step: int, command: list[str], where: StepLayout
           ) -> tuple[list[_Task], list[threading.Thread]]:
    """Every task of the step, each with the threads that pass its output on; a task's node is recorded as its
    index in the job's nodes (what the simulator's faults name)."""
    procs: list[_Task] = []
    forwarders: list[threading.Thread] = []
    for rank in range(where.ntasks):
        name = where.nodes[rank // where.per_node]
        env = {**os.environ, **task_env(spec, job["restart"], step, rank, job["submit_dir"], where)}
        env.update(_rehearsed(spec, name, rank, first_run=job["restart"] == 0))
        # SLURM_TASK_PID is the task's own pid: only the task can say it, so a shell sets it and execs the command.
        p = subprocess.Popen(["/bin/sh", "-c", 'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$@"', "srun",
                              *command], env=env, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        procs.append((p, spec.node_names.index(name), rank))
        for pipe, target in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
            forwarders.append(threading.Thread(target=_forward_lines, args=(pipe, target), daemon=True))
            forwarders[-1].start()
    return procs, forwarders


def _signal(procs: list[_Task], signum: int) -> None:
    for p, _, _ in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signum)


def _wait(state: SimState, spec: JobSpec, step: int, procs: list[_Task], kill_on_bad_exit: bool,
          wait_s: float = 0.0) -> dict[int, int]:
    """Every task's exit code, as srun reports them. With --kill-on-bad-exit, the first failure ends the step as
    Slurm does (docs/slurm.md): SIGCONT and SIGTERM to the other tasks at once, SIGKILL after the kill wait. With
    --wait, the tasks left ``wait_s`` after the first one ended are ended the same way (a frozen task)."""
    # Shape: srun's wait loop: collect, then each way of ending the others (bad exit, --wait, the kill wait)
    codes: dict[int, int] = {}
    kill_at: float | None = None
    first_end: float | None = None
    while len(codes) < len(procs):
        failed = _collect(state, spec, step, procs, codes)
        first_end = time.monotonic() if first_end is None and codes else first_end
        if failed and kill_on_bad_exit and kill_at is None:
            kill_at = _terminate(spec, step, procs, "")
        if kill_at is None and _waited(first_end, wait_s):
            kill_at = _terminate(spec, step, procs, f" (--wait: {wait_s:g} s after the first task ended)")
        if kill_at is not None and time.monotonic() >= kill_at:
            _signal(procs, signal.SIGKILL)
            kill_at = float("inf")
        time.sleep(0.02)
    return codes


def _collect(state: SimState, spec: JobSpec, step: int, procs: list[_Task], codes: dict[int, int]) -> bool:
    """Record the tasks that ended since the last look; True when one of them failed."""
    failed = False
    for p, node, rank in procs:
        if rank not in codes and p.poll() is not None:
            failed |= _ended(state, spec, step, p.returncode, node, rank, codes)
    return failed


def _waited(first_end: float | None, wait_s: float) -> bool:
    return wait_s > 0 and first_end is not None and time.monotonic() >= first_end + wait_s


def _terminate(spec: JobSpec, step: int, procs: list[_Task], why: str) -> float:
    """SIGCONT and SIGTERM to the step's tasks; returns when SIGKILL follows (the kill wait)."""
    print(f"srun: Terminating StepId={spec.job_id}.{step}{why}", file=sys.stderr, flush=True)
    _signal(procs, signal.SIGCONT)
    _signal(procs, signal.SIGTERM)
    return time.monotonic() + spec.kill_wait_s


def _ended(state: SimState, spec: JobSpec, step: int, code: int, node: int, rank: int, codes: dict[int, int]) -> bool:
    """A task ended with ``code``: recorded at once (srun itself may be killed before the step ends) and, when it
    failed, said as srun says it. True when it failed."""
    codes[rank] = code if code >= 0 else 128 - code
    state.add_task_exit(step, rank, code)
    if code == 0:
        return False
    what = f"Exited with exit code {code}" if code > 0 else (signal.strsignal(-code) or f"signal {-code}")
    print(f"srun: error: {spec.node_names[node]}: task {rank}: {what}", file=sys.stderr, flush=True)
    return True


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
