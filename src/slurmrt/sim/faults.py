"""Faults replayed over a job's life: drawn from a mean time between failures and a seed, or read from a trace.

One injector for ``slurmrt sim --mtbf``/``--trace`` and for the fault campaign (``benchmarks/chaos.py``) and the
goodput benchmark (``benchmarks/bench_goodput.py``), which run the simulator with a trace of their own.

A fault's time is counted on the job's clock: the seconds its runs have run, summed over requeues. With
``--after-checkpoint`` each run's time counts from its first committed checkpoint: training time, so a trace hits the
same progress on a fast machine and a slow one, and never a run's start. A fault whose moment falls while a run is
already ending comes at the next run's start (its clock's start).

A trace whose header is ``step,kind,node`` runs on the training clock instead: a fault at step N comes when the job
reports (in its ``progress`` events, every ``progress_s``) that it trains at step N or past it, at most one fault per
report, so that the job is back at work before the next. Every run of a policy meets the same faults at the same
steps of training, however long its recoveries take; a fault at a step the job never reaches is not injected. The
kinds:

- ``node-loss``: every task of one node is SIGKILLed (with ``--no-kill``, a node other than the batch script's leaves
  the job, as a node Slurm marks down);
- ``rank-crash``: one task is SIGKILLed (a segfault, an OOM kill);
- ``hang``: one task is frozen (SIGSTOP), as a hung collective looks from outside;
- ``preemption``: the job's ``--signal`` at once, SIGTERM after the grace time, and a requeue;
- ``signal-storm``: a burst of SIGUSR1, SIGUSR2 and SIGTERM to every task at once (a launcher that forwards in a
  loop, an impatient ``scancel``): the job must stop once, save once and requeue. Not in the default weights.

The node or task a fault hits is drawn with it (an index, taken modulo what is alive when it fires), so a seed
replays the same campaign whatever the machine's speed.
"""

from __future__ import annotations

import csv
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from .. import _figures as figures
from .._errors import ConfigError

__all__ = ["KINDS", "Fault", "draw", "on_steps", "parse_duration", "parse_weights", "read_trace", "write_trace"]

KINDS = ("node-loss", "rank-crash", "hang", "preemption", "signal-storm")
#: The default weights: Llama 3's 466 interruptions were mostly hardware (GPUs, memory, network: a lost node or a
#: crashed rank); hangs and preemptions are rarer on a dedicated allocation.
DEFAULT_WEIGHTS = {"node-loss": 4.0, "rank-crash": 3.0, "hang": 2.0, "preemption": 1.0}
#: The highest step a trace on the training clock may name.
MAX_STEP = 10**12
#: A trace longer than this is refused: a typo in --mtbf (10ms for 10m) must not draw millions of faults.
MAX_FAULTS = 100_000


@dataclass(frozen=True)
class Fault:
    at_s: float  #: on the job's clock (0 for a fault on the training clock)
    kind: str
    #: The node (node-loss) or task (rank-crash, hang) it hits, modulo those alive when it fires.
    target: int = 0
    #: On the training clock: the step at or past which it comes (None: on the job's clock, at ``at_s``).
    at_step: int | None = None

    def describe(self) -> str:
        return f"{self.kind} at " + (f"step {self.at_step}" if self.at_step is not None else f"{self.at_s:.1f} s")

    @property
    def moment(self) -> float:
        """Its place in its trace, on whichever clock it runs."""
        return float(self.at_step) if self.at_step is not None else self.at_s


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DIGITS = re.compile(r"[0-9]{1,13}")  # ASCII digits only: "²".isdigit() holds, and int("²") raises
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*")


def parse_duration(value: str, what: str = "--mtbf") -> float:
    """``90``, ``90s``, ``10m``, ``1.5h``, ``2d`` -> seconds (more than 0)."""
    match = _DURATION.fullmatch(value)
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match is not None else None
    if seconds is None or not 0.001 <= seconds <= figures.MAX_SECONDS:
        shown = value if len(value) <= 40 else f"{value[:30]}... ({len(value)} characters)"
        raise ConfigError(f"{what} {shown!r}: a duration above 0 (1 ms to 100 years), in seconds or with a unit: "
                          "90, 90s, 10m, 1.5h, 2d", value=value)
    return seconds


def parse_weights(value: str | None) -> dict[str, float]:
    """``node-loss=4,hang=1``: the relative weight of each kind; kinds not named get 0. None: the defaults."""
    if value is None:
        return dict(DEFAULT_WEIGHTS)
    weights = {kind: 0.0 for kind in KINDS}
    for part in value.split(","):
        kind, eq, number = part.strip().partition("=")
        if kind not in KINDS or not eq:
            raise ConfigError(f"--fault-weights {value!r}: KIND=WEIGHT,... with KIND one of {', '.join(KINDS)}",
                              value=value)
        try:
            weights[kind] = float(number)
        except ValueError:
            weights[kind] = -1.0
        if not (math.isfinite(weights[kind]) and weights[kind] >= 0):
            raise ConfigError(f"--fault-weights {value!r}: {kind}'s weight {number!r} is not a number, 0 or more",
                              value=value)
    if not sum(weights.values()) > 0:
        raise ConfigError(f"--fault-weights {value!r}: at least one kind needs a weight above 0", value=value)
    return weights


def draw(mtbf_s: float, seed: int, *, horizon_s: float, weights: dict[str, float] | None = None,
         targets: int = 1024) -> list[Fault]:
    """Faults with exponential inter-arrival times of mean ``mtbf_s`` up to ``horizon_s`` of the job's clock, kinds
    by ``weights``: the same list for the same arguments."""
    if horizon_s / mtbf_s > MAX_FAULTS:
        raise ConfigError(f"--mtbf {mtbf_s:g} s over {horizon_s:g} s would draw about {horizon_s / mtbf_s:.0f} "
                          f"faults (at most {MAX_FAULTS}): is the unit right?")
    rng = random.Random(seed)
    weights = weights or DEFAULT_WEIGHTS
    kinds = [k for k in KINDS if weights.get(k, 0) > 0]
    faults: list[Fault] = []
    clock = 0.0
    while True:
        clock += rng.expovariate(1.0 / mtbf_s)
        if clock > horizon_s:
            return faults
        kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
        # never 0.000: the trace format (and --at) wants a time above 0
        faults.append(Fault(max(round(clock, 3), 0.001), kind, rng.randrange(targets)))


def on_steps(faults: list[Fault], step_s: float, *, min_gap: int = 1) -> list[Fault]:
    """``faults`` moved to the training clock: a fault at ``t`` seconds comes at step ``t / step_s``, and each one at
    least ``min_gap`` steps after the one before it (a trace's faults closer than the job's recovery are one
    moment, not two)."""
    if not (step_s > 0 and min_gap >= 1):
        raise ValueError(f"on_steps: step_s {step_s!r} above 0 and min_gap {min_gap!r} at least 1")
    moved: list[Fault] = []
    for fault in faults:
        step = max(1, round(fault.at_s / step_s), (moved[-1].at_step or 0) + min_gap if moved else 1)
        moved.append(Fault(0.0, fault.kind, fault.target, at_step=step))
    return moved


def read_trace(path: Path) -> list[Fault]:
    """A CSV trace: ``time,kind[,node]`` per line (time in seconds or with a unit, ``10m``; a header line and
    ``#`` comments are skipped), in time order. A first line ``step,kind,node`` makes it a trace on the training
    clock: each line's first field is a step, 1 or more."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--trace {path}: cannot be read: {err}", path=str(path)) from None
    faults = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.count('"') % 2:
            raise ConfigError(f"--trace {path}:{number}: {line!r}: a double quote with no closing one (it would join "
                              "the lines after it into one field): remove it; each line is time,kind[,node]",
                              path=str(path))
    rows = list(csv.reader(text.splitlines()))
    steps = bool(rows and rows[0]) and rows[0][0].strip().lower() == "step"
    for number, row in enumerate(rows, 1):
        fault = _fault(row, f"--trace {path}:{number}", header=number == 1, steps=steps)
        if fault is not None:
            faults.append(fault)
        if len(faults) > MAX_FAULTS:
            raise ConfigError(f"--trace {path}: more than {MAX_FAULTS} faults", path=str(path))
    return sorted(faults, key=lambda f: f.moment)


def _fault(row: list[str], where: str, *, header: bool, steps: bool) -> Fault | None:
    """One line of a trace; None for a blank line, a comment or the header."""
    # Shape: one trace line's checks in order, each naming the line and what to write instead
    cells = [c.strip() for c in row]
    first = cells[0] if cells else ""
    if not first or first.startswith("#") or (header and first.lower() in ("time", "step")):
        return None
    clock = "step" if steps else "time"
    if len(cells) not in (2, 3) or cells[1] not in KINDS:
        raise ConfigError(f"{where}: {','.join(row)!r}: give {clock},kind[,node] with kind one of {', '.join(KINDS)}")
    target = _target(cells[2] if len(cells) == 3 else "", where)
    if steps:
        return Fault(0.0, cells[1], target, at_step=_step(first, where))
    return Fault(_at(first, where), cells[1], target)


def _step(text: str, where: str) -> int:
    """A line's step in a trace on the training clock."""
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_STEP:
        raise ConfigError(f"{where}: step {text!r}: a training step, 1 to {MAX_STEP} (the trace's first line "
                          "says step,kind,node: the training clock)")
    return int(text)


def _target(text: str, where: str) -> int:
    """A trace line's node or task: empty (0), or an index."""
    if text and not _DIGITS.fullmatch(text):
        raise ConfigError(f"{where}: node {text!r}: a node or task index, 0 or more")
    return int(text) if text else 0


def _at(text: str, where: str) -> float:
    """A trace line's time: 0, or a duration."""
    return 0.0 if text in ("0", "0s") else parse_duration(text, where)


def write_trace(path: Path, faults: list[Fault]) -> None:
    """The trace ``read_trace`` reads back (the campaign and the benchmark hand theirs to the simulator so): on the
    training clock when its faults are (all or none of them)."""
    steps = {f.at_step is not None for f in faults}
    if len(steps) > 1:
        raise ValueError("write_trace: a trace runs on one clock: every fault at a step, or none")
    if steps == {True}:
        path.write_text("step,kind,node\n" + "".join(f"{f.at_step},{f.kind},{f.target}\n" for f in faults))
        return
    path.write_text("time,kind,node\n" + "".join(f"{f.at_s:.3f},{f.kind},{f.target}\n" for f in faults))
