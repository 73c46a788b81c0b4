"""init() options: keyword arguments, each with a ``SLURMRT_*`` environment variable (docs/reference/environment.md).

An explicit argument wins over the environment, which wins over the default.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import _figures as figures
from ._errors import ConfigError
from ._safefs import group_id
from .launch.parallel import ParallelConfig
from .stop.signals import DEFAULT_SIGNALS, parse_signal

__all__ = ["DEPRECATED", "OTHER_VARIABLES", "Options", "unknown_variables", "warn_unknown"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Options:
    #: Where checkpoints go; a directory every node sees. Required for save() and load_latest().
    checkpoint_dir: Path | None = None
    #: A path anyone may create to stop the job (or every task of an array) cleanly, without requeue.
    kill_switch: Path | None = None
    keep_last: int = 3
    #: A node-local directory (``/dev/shm``, ``$SLURM_TMPDIR``, an NVMe path) for ``save(..., tier="local")``: fast
    #: saves each kept on the node and on a partner node. None: no local tier.
    local_checkpoint_dir: Path | None = None
    #: Steps the local tier keeps on each node (each its own parts and the partner's replicas).
    local_keep: int = 2
    #: Milestones: a checkpoint whose step is a multiple of this is never pruned. None: no milestones.
    keep_every: int | None = None
    #: Threads that write (and checksum) one rank's part of a checkpoint.
    save_threads: int = 4
    #: How much lower than the training's the CPU priority of a background save's write is (a nice increment,
    #: 0-19; Linux). 0: the training's own.
    save_nice: int = 10
    #: Write background saves from a helper process (its own GIL, at ``save_nice``) fed from shared memory, not from
    #: threads of the training process (Linux; elsewhere threads). See ``slurmrt.checkpoint.helper``.
    save_process: bool = True
    signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS
    requeue: bool = True
    max_restarts: int | None = None
    deadline: bool = True
    #: Safety margin kept free before the job's end time, on top of the steps and the save.
    deadline_margin_s: float = 30.0
    #: Save time assumed until one has been measured.
    save_time_s: float = 30.0
    #: Slurm's KillWait: time between SIGTERM and SIGKILL.
    kill_wait_s: float = 30.0
    #: How often the watcher thread looks at what may stop or end the run between two steps: the kill switch, the
    #: job's end time, the lease's heartbeat and the hang watchdog. (Was ``kill_switch_poll_s``.)
    watch_interval_s: float = 5.0
    #: How long a hang's census waits for every rank's answer; None: 3 watch intervals, at least 10 s.
    census_wait_s: float | None = None
    end_time_refresh_s: float = 900.0
    #: The hang watchdog (see slurmrt.hang.watchdog): on by default.
    watchdog: bool = True
    #: A fixed allowance for one training step; None: learned from the measured steps (10x the slowest recent one).
    hang_timeout_s: float | None = None
    #: The least allowance the watchdog ever gives a step, a save, a load or a phase.
    hang_floor_s: float = 180.0
    #: The allowance from init() to the end of the warm-up steps, and for a phase never measured.
    startup_timeout_s: float = 1200.0
    #: At most this many nodes excluded from the job by slurmrt, over all its runs.
    max_excluded_nodes: int = 4
    #: Stop requeueing after this many runs in a row committed no newer checkpoint. None: never stop.
    max_futile_runs: int | None = 3
    #: Check the node at start-up (CUDA, /dev/shm, the checkpoint directory) and the communication at the first
    #: collective; a failed check excludes the node and requeues the job.
    health_check: bool = False
    #: What a rank named a straggler (slurmrt.stop.straggler; measured by ``rt.time_compute()``) costs its node:
    #: "name" (the log, the event log, ``slurmrt status``), "exclude" (also left out at the next in-job restart or
    #: requeue, whatever causes it) or "replace" (also a stop now, a save, and a restart without the node: a new
    #: step on a spare under ``slurmrt run``, else a requeue with it excluded).
    straggler: str = "name"
    #: A straggler's timed section is at least 1 + this times the slowest rank's on the other nodes ...
    straggler_margin: float = 0.25
    #: ... in each of ``straggler_windows`` windows in a row, of ``straggler_window`` timed steps each.
    straggler_window: int = 20
    straggler_windows: int = 3
    #: A group whose checkpoint files this job trusts and loads (a name or a gid): by default only files of this
    #: user's (or root's) are unpickled. See ``slurmrt.checkpoint.trust``.
    trusted_group: str | None = None
    #: The checkpoint directory is shared with other users on purpose: its mode (``o+w``) is not refused.
    shared_checkpoint_dir: bool = False
    event_log: Path | None = None
    #: The experiment id: by default the one stored next to the checkpoints (new for a fresh directory).
    experiment_id: str | None = None
    #: Rank 0 records its step in the event log this often (the timeline of ``slurmrt status``, ``slurmrt sim``).
    progress_s: float | None = 10.0
    #: slurmrt's own log lines (the ``slurmrt`` logger) get a handler of their own at init(): time, level and
    #: ``[host:rank]``, INFO on rank 0 and warnings on every rank, under the job's flock. Skipped when the program
    #: configured logging first (the root logger or ``slurmrt`` has a handler). False: never.
    log_handler: bool = True
    #: Rank 0 writes the job's goodput (``slurmrt status``'s ledger) here as OpenMetrics text at the end of each
    #: run, replaced whole: for Prometheus' textfile collector. None: not written.
    metrics_file: Path | None = None
    #: ``rt.should_save``'s prior: one failure in this many node-hours (Llama 3's run had about one in 5,700), until
    #: the experiment's own history says more (slurmrt.checkpoint.cadence).
    mtbf_node_h: float = 5000.0
    #: The job's declared shape, for the launch checks and the CUDA rule. Its fields are init() options of their
    #: own (``tp=2``, ``SLURMRT_TP``), and so is ``megatron_args``, Megatron-LM's command line, read in their place.
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def kill_switch_poll_s(self) -> float:
        """Deprecated: :attr:`watch_interval_s` (it paces more than the kill switch)."""
        warnings.warn("Options.kill_switch_poll_s is deprecated: use watch_interval_s", DeprecationWarning,
                      stacklevel=2)
        return self.watch_interval_s

    def explicit(self) -> dict[str, Any]:
        """The fields set to something other than their default, the job's shape flattened (``tp=2``)."""
        default, shape = Options(), ParallelConfig()
        own = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "parallel" and getattr(self, f.name) != getattr(default, f.name)}
        return own | {f.name: getattr(self.parallel, f.name) for f in fields(shape)
                      if getattr(self.parallel, f.name) != getattr(shape, f.name)}

    @classmethod
    def resolve(cls, given: Mapping[str, Any], env: Mapping[str, str], base: Options | None = None) -> Options:
        """The options of a run: ``given`` (keyword arguments), then what ``base`` sets (an ``Options`` passed to
        init()), then ``SLURMRT_*`` in ``env``, then the defaults; every value checked (:func:`_convert`)."""
        if base is not None:
            given = {**base.explicit(), **given}
        own = {f.name for f in fields(cls)} - {"parallel"}
        shape = {f.name for f in fields(ParallelConfig)} | {"megatron_args"}
        unknown = sorted(set(given) - own - shape - set(DEPRECATED))
        if unknown:
            raise TypeError(f"slurmrt.init() got unknown options {unknown}; known: {sorted(own | shape)}")
        values = {name: value for name in sorted(own | shape) if (value := _value(name, given, env)) is not _UNSET}
        for name, value in _deprecated(given, env).items():
            values.setdefault(name, value)  # the new name, when given too, wins
        declared = {k: values.pop(k) for k in shape if k in values}
        return cls(parallel=ParallelConfig.declared(env, **declared), **values)


#: Options renamed, by their old names: the old name (argument or variable) still works, with a warning.
DEPRECATED = {"kill_switch_poll_s": "watch_interval_s"}


#: An option that neither an argument nor the environment sets (None is a value: "none" for max_futile_runs).
_UNSET = object()


def _value(name: str, given: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """Option ``name`` as given, else as ``SLURMRT_<NAME>`` says, checked; ``_UNSET`` when neither sets it."""
    if given.get(name) is not None:
        return _convert(name, given[name])
    raw = env.get(f"SLURMRT_{name.upper()}")
    return _convert(name, raw) if raw else _UNSET


def _deprecated(given: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Values set under an old name, checked under the name the user wrote, keyed by the new name."""
    found: dict[str, Any] = {}
    for old, new in DEPRECATED.items():
        source, raw = old, given.get(old)
        if raw is None:
            source, raw = f"SLURMRT_{old.upper()}", env.get(f"SLURMRT_{old.upper()}") or None
        if raw is None:
            continue
        said = f"{source} is deprecated: use {new} (SLURMRT_{new.upper()}); it paces more than its old name says"
        warnings.warn(said, DeprecationWarning, stacklevel=4)
        logger.warning("%s", said)
        found[new] = _convert(old, raw)
    return found


#: ``SLURMRT_*`` variables that are not init() options, each read where it acts (docs/reference/environment.md).
OTHER_VARIABLES = frozenset({"SLURMRT_LOCK_FILE", "SLURMRT_ALLOW_NODE_RANK_REORDER", "SLURMRT_EVENT_COPY",
                             "SLURMRT_SIM_DIR", "SLURMRT_SIM_UNHEALTHY", "SLURMRT_CLUSTER_DIR",
                             "SLURMRT_BENCH_DIR", "SLURMRT_RUN_DIR", "SLURMRT_RUN_ATTEMPT", "SLURMRT_RUN_SPARES",
                             "SLURMRT_RUN_MAX_RESTARTS", "SLURMRT_NODE_LEDGER"})


def warn_unknown(env: Mapping[str, str]) -> None:
    for name in unknown_variables(env):
        logger.warning("%s is set but slurmrt reads no such variable (misspelt?): it has no effect", name)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """The ``SLURMRT_*`` variables in ``env`` that slurmrt does not read: a misspelt one (``SLURMRT_KILLSWITCH``)
    would otherwise leave its protection off without a word."""
    known = {f"SLURMRT_{f.name.upper()}" for f in fields(Options) if f.name != "parallel"}
    known |= {f"SLURMRT_{f.name.upper()}" for f in fields(ParallelConfig)} | {"SLURMRT_MEGATRON_ARGS"}
    known |= {f"SLURMRT_{old.upper()}" for old in DEPRECATED}
    return sorted(k for k in env if k.startswith("SLURMRT_") and k not in known and k not in OTHER_VARIABLES)


_PATHS = {"checkpoint_dir", "kill_switch", "event_log", "local_checkpoint_dir", "metrics_file"}
#: Integers and the least value each takes.
_INTS = {"keep_last": 1, "local_keep": 1, "keep_every": 1, "save_threads": 1, "save_nice": 0, "max_restarts": 0,
         "max_excluded_nodes": 0, "max_futile_runs": 1, "straggler_window": 2,
         "straggler_windows": 1, "nnodes": 1, "gpus_per_node": 0, "tp": 1, "pp": 1, "cp": 1}
#: Seconds and the least value each takes (a poll of 0 s burns a core; a negative margin or save time turns the
#: deadline off without a word; a progress sample under 1 s wrote an event per step: 2,583 events in 3 s).
_FLOATS = {"deadline_margin_s": 0.0, "save_time_s": 0.0, "kill_wait_s": 0.0, "kill_switch_poll_s": 0.01,
           "watch_interval_s": 0.01, "census_wait_s": 0.01,
           "end_time_refresh_s": 1.0, "hang_timeout_s": 0.01, "progress_s": 1.0, "hang_floor_s": 0.01,
           "startup_timeout_s": 0.01, "mtbf_node_h": 0.001}
#: Options whose "none"/"off"/"never" is a value: no limit, no milestones, no fixed allowance, no progress events.
_OPTIONAL = {"max_restarts", "max_futile_runs", "keep_every", "hang_timeout_s", "progress_s", "census_wait_s"}
#: Options that take one of a few words.
_CHOICES = {"straggler": ("name", "exclude", "replace")}
_BOOLS = {"requeue", "deadline", "watchdog", "health_check", "save_process", "fsdp", "moe_overlap",
          "shared_checkpoint_dir", "log_handler"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_NONE = {"none", "off", "never"}
#: Signals a process cannot catch: a recorder for them would never run.
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def _convert(name: str, value: Any) -> Any:
    """``value`` (an argument, or the text of ``SLURMRT_<NAME>``) as option ``name`` takes it, checked: the one
    place every option is validated. :class:`ConfigError` naming the value, the rule and the fix."""
    try:
        return _parse(name, value)
    except (TypeError, ValueError, OverflowError) as err:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:40] + f"... ({len(repr(value))} characters)"
        raise ConfigError(f"option {name}={shown} is invalid: {err}", option=name, value=value) from None


def _parse(name: str, value: Any) -> Any:
    text = value.strip().lower() if isinstance(value, str) else None
    if name in _OPTIONAL and text in _NONE:
        return None
    for names, parse in _PARSERS:
        if name in names:
            return parse(name, value, text)
    return value


def _path(name: str, value: Any, text: str | None) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError("an empty path would be the current directory; give a path, or leave the option unset")
    return Path(os.path.expanduser(str(value)))


def _int(name: str, value: Any, text: str | None) -> int:
    if isinstance(value, (bool, float)) or (text is not None and not text.lstrip("-").isdigit()):
        raise ValueError("not a whole number")
    number = int(value)
    if not _INTS[name] <= number <= figures.MAX_COUNT:
        raise ValueError(f"must be at least {_INTS[name]} and at most {figures.MAX_COUNT}")
    return number


def _seconds(name: str, value: Any, text: str | None) -> float:
    unit, most = ("hours", figures.MAX_HOURS) if name.endswith("_h") else ("seconds", figures.MAX_SECONDS)
    if isinstance(value, bool):
        raise ValueError(f"not a number of {unit}")
    seconds = float(value)
    if not math.isfinite(seconds) or not _FLOATS[name] <= seconds <= most:
        raise ValueError(f"{unit}, at least {_FLOATS[name]:g} and at most {most:g}, finite" + (
            " (or 'none')" if name in _OPTIONAL else ""))
    return seconds


def _bool(name: str, value: Any, text: str | None) -> bool:
    if isinstance(value, bool):
        return value
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("use 1/true/yes/on or 0/false/no/off (an unknown word must not turn a protection off)")


def _choice(name: str, value: Any, text: str | None) -> str:
    if text not in _CHOICES[name]:
        raise ValueError(f"use one of {', '.join(_CHOICES[name])}")
    return text


def _fraction(name: str, value: Any, text: str | None) -> float:
    if isinstance(value, bool):
        raise ValueError("not a number")
    number = float(value)
    if not math.isfinite(number) or not 0.01 <= number <= 100:
        raise ValueError("a fraction between 0.01 and 100 (0.25: 25 % slower)")
    return number


def _signals(name: str, value: Any, text: str | None) -> tuple[signal.Signals, ...]:
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    signals = tuple(parse_signal(s) for s in items)
    caught = sorted(s.name for s in signals if s in _UNCATCHABLE)
    if caught:
        raise ValueError(f"{', '.join(caught)} cannot be caught by any process; use USR1, USR2, TERM or INT")
    return signals


def _group(name: str, value: Any, text: str | None) -> str:
    group = str(value).strip()
    group_id(group)  # ValueError when the node knows no such group
    return group


def _argv(name: str, value: Any, text: str | None) -> tuple[str, ...]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(str(a) for a in value)
    return tuple(str(value).split())


_PARSERS: tuple[tuple[Any, Callable[[str, Any, str | None], Any]], ...] = (
    (_PATHS, _path), (_INTS, _int), (_FLOATS, _seconds), (_BOOLS, _bool), ({"signals"}, _signals),
    (_CHOICES, _choice), ({"straggler_margin"}, _fraction),
    ({"megatron_args"}, _argv), ({"trusted_group"}, _group))
