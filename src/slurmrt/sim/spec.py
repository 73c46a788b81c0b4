"""What a simulated job asks for: the sbatch options ``slurmrt sim`` understands, from #SBATCH lines or flags."""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._errors import ConfigError
from ..launch import hostlist
from ..stop.signals import parse_signal
from .faults import Fault

__all__ = ["JobSpec", "parse_sbatch_script", "parse_signal_option", "parse_time"]


@dataclass(frozen=True)
class JobSpec:
    command: tuple[str, ...] = ()
    #: A batch script to run instead of ``srun COMMAND`` (the ``slurmrt sim job.sbatch`` form).
    script: Path | None = None
    nodes: int = 1
    ntasks_per_node: int = 1
    time_s: float | None = None
    signal: signal.Signals | None = None
    signal_lead_s: float = 0.0
    signal_batch: bool = False
    requeue: bool = False
    job_name: str = "sim"
    job_id: int = 0
    kill_wait_s: float = 10.0
    preempt_at_s: float | None = None
    grace_s: float = 0.0
    cancel_at_s: float | None = None
    fail_node: int | None = None
    fail_at_s: float | None = None
    #: SIGSTOP this task (its rank) at fail_at_s: a frozen process, as a hang looks from the outside.
    hang_task: int | None = None
    #: The node (index into the first run's node names) whose health check fails; its name, once known.
    unhealthy_node: int | None = None
    unhealthy_name: str | None = None
    #: (task, step): that task's loss of that step is NaN in ``rt.check``, in the first run only; every run, and every
    #: time its process reaches the step, with ``nan_repeats`` (a bad batch).
    nan: tuple[int, int] | None = None
    nan_repeats: bool = False
    #: (task, step): a bit of that task's replicas (``rt.check(..., replicas=)``) flips at that step, in the first
    #: run only (silent corruption: no NaN; the replica hash finds it).
    flip: tuple[int, int] | None = None
    #: (task, step): that task's loss of that step spikes in ``rt.check``, in every run and each time its process
    #: reaches the step (a batch that causes it: reproducible).
    spike: tuple[int, int] | None = None
    #: Count preempt_at_s, cancel_at_s and fail_at_s from the first run's first committed checkpoint.
    after_checkpoint: bool = False
    max_restarts: int = 5
    kill_on_bad_exit: bool = True
    #: --no-kill: a failed node leaves the job (its tasks die), and the job goes on with the nodes it still holds.
    no_kill: bool = False
    #: ``slurmrt run --spare-nodes`` in the batch script the simulator writes (the COMMAND form): of ``nodes``,
    #: these are kept as spares for in-job restarts.
    spare_nodes: int = 0
    #: The node (index into the first run's node names) whose tasks run ``slow_factor`` times slower; its name.
    slow_node: int | None = None
    slow_name: str | None = None
    slow_factor: float = 4.0
    node_names: tuple[str, ...] = field(default=())
    #: --open-mode: "a" (append) or "t" (truncate); Slurm exports it as SLURM_OPEN_MODE when given.
    open_mode: str | None = None
    #: Faults over the job's life (``--mtbf``, ``--trace``: slurmrt.sim.faults), and where they came from.
    faults: tuple[Fault, ...] = ()
    fault_source: str = ""
    #: Seconds between a requeued run's end and the next run's start (0: at once).
    requeue_wait_s: float = 0.0

    @property
    def ntasks(self) -> int:
        return self.nodes * self.ntasks_per_node

    def describe(self) -> str:
        """The job in one line, as the simulator's first line shows it."""
        said = f"job {self.job_id}: {self.nodes} node(s) x {self.ntasks_per_node} task(s) on " \
            f"{hostlist.compress(self.node_names)}"
        if self.time_s:
            said += f", --time {self.time_s:.0f} s"
        if self.signal:
            said += f", --signal {'B:' if self.signal_batch else ''}{self.signal.name}@{self.signal_lead_s:.0f}"
        return said + (", requeue" if self.requeue else "")


def parse_time(value: str) -> float:
    """Slurm's --time formats, in seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    text = value.strip()
    days, parts = "0", text.split(":")
    if "-" in text:
        days, _, rest = text.partition("-")
        parts = rest.split(":")
    fields = [days, *parts]
    if not all(f.isdigit() and f.isascii() for f in fields) or len(parts) > 3:
        raise ConfigError(f"--time={value!r}: use minutes, MM:SS, HH:MM:SS or D-HH:MM:SS as sbatch does", value=value)
    numbers = [int(p) for p in parts]
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        h, m, s = (numbers + [0, 0, 0])[:3]
    elif len(numbers) == 3:  # H:M:S
        h, m, s = numbers
    else:  # M, M:S
        h, m, s = 0, numbers[0], (numbers[1] if len(numbers) == 2 else 0)
    return float(int(days) * 86400 + h * 3600 + m * 60 + s)


_SIGNAL = re.compile(r"(B:)?([A-Za-z0-9]+)(?:@(\d+))?")


def parse_signal_option(value: str) -> tuple[signal.Signals, float, bool]:
    """``[B:]SIG[@SECS]`` -> (signal, lead seconds, to the batch shell only). Slurm's default lead is 60 s."""
    match = _SIGNAL.fullmatch(value.strip())
    if match is None:
        raise ConfigError(f"--signal={value!r}: use [B:]SIG[@SECONDS], e.g. USR1@120 or B:USR1@120", value=value)
    try:
        sig = parse_signal(match.group(2))
    except ValueError as err:
        raise ConfigError(f"--signal={value!r}: {err}", value=value) from None
    return sig, float(match.group(3) or 60), bool(match.group(1))


def apply_option(spec: JobSpec, name: str, value: str | None) -> JobSpec:
    """One sbatch option (long name without dashes) onto ``spec``; unknown options are ignored by the caller."""
    # Shape: a dispatch on sbatch's option names, one case each, as sbatch reads them
    if name in {"nodes", "N"}:
        return replace(spec, nodes=_count(f"--{name}", str(value), str(value).split("-")[0]))
    if name in {"ntasks-per-node"}:
        return replace(spec, ntasks_per_node=_count(f"--{name}", str(value), str(value)))
    if name in {"time", "t"}:
        return replace(spec, time_s=parse_time(str(value)))
    if name == "signal":
        sig, lead, batch = parse_signal_option(str(value))
        return replace(spec, signal=sig, signal_lead_s=lead, signal_batch=batch)
    if name == "requeue":
        return replace(spec, requeue=True)
    if name in {"no-kill", "k"}:
        if value not in (None, "", "off"):
            raise ConfigError(f"--no-kill={value!r}: only --no-kill (or --no-kill=off) is simulated", value=value)
        return replace(spec, no_kill=value != "off")
    if name == "no-requeue":
        return replace(spec, requeue=False)
    if name in {"job-name", "J"}:
        return replace(spec, job_name=str(value))
    if name == "open-mode":
        if value not in {"append", "truncate"}:
            raise ConfigError(f"--open-mode={value!r}: use append or truncate", value=value)
        return replace(spec, open_mode=str(value)[0])
    raise KeyError(name)


def _count(flag: str, given: str, value: str) -> int:
    """``value`` (the count read off ``given``: "2" of "--nodes=2-4") as a count of at least 1."""
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"{flag}={given!r}: a whole number, at least 1", value=given)
    return int(value)


_SHORT = {"N": "nodes", "t": "time", "J": "job-name", "k": "no-kill"}


def parse_sbatch_script(path: Path, spec: JobSpec) -> tuple[JobSpec, list[str]]:
    """Read the #SBATCH lines of ``path`` (up to the first command, as sbatch does); returns the spec and the options
    it ignored."""
    ignored: list[str] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"batch script {path} cannot be read: {err}", path=str(path)) from None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break  # sbatch stops reading directives at the first command
        tokens = shlex.split(stripped[len("#SBATCH"):], comments=True)
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token in {"-N", "-t", "-J"} and i + 1 < len(tokens):  # "-N 2": the value is the next token
                token, i = token + tokens[i + 1], i + 1
            spec, rest = _apply_token(spec, token)
            ignored.extend(rest)
            i += 1
    return replace(spec, script=path), ignored


def _apply_token(spec: JobSpec, token: str) -> tuple[JobSpec, list[str]]:
    if token.startswith("--"):
        name, eq, value = token[2:].partition("=")
        try:
            return apply_option(spec, name, value if eq else None), []
        except KeyError:
            return spec, [token]
    if token == "-k":
        return apply_option(spec, "no-kill", None), []
    if token.startswith("-") and len(token) > 2 and token[1] in _SHORT:
        try:
            return apply_option(spec, _SHORT[token[1]], token[2:]), []
        except KeyError:
            return spec, [token]
    return spec, [token]
