"""init() options: keyword arguments, each with a ``SLURMRT_*`` environment variable (documented in the README).

An explicit argument wins over the environment, which wins over the default.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._env import truthy
from ._errors import ConfigError
from .launch.parallel import ParallelConfig
from .stop.signals import DEFAULT_SIGNALS, parse_signal

__all__ = ["Options"]


@dataclass(frozen=True, kw_only=True)
class Options:
    #: Where checkpoints go; a directory every node sees. Required for save() and load_latest().
    checkpoint_dir: Path | None = None
    #: A path anyone may create to stop the job (or every task of an array) cleanly, without requeue.
    kill_switch: Path | None = None
    keep_last: int = 3
    #: Milestones: a checkpoint whose step is a multiple of this is never pruned. None: no milestones.
    keep_every: int | None = None
    #: Threads that write (and checksum) one rank's part of a checkpoint.
    save_threads: int = 4
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
    kill_switch_poll_s: float = 5.0
    end_time_refresh_s: float = 900.0
    #: The hang watchdog (see slurmrt.stop.watchdog): on by default.
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
    event_log: Path | None = None
    #: The experiment id: by default the one stored next to the checkpoints (new for a fresh directory).
    experiment_id: str | None = None
    #: Rank 0 records its step in the event log this often (the timeline of ``slurmrt status``, ``slurmrt sim``).
    progress_s: float | None = 10.0
    #: The job's declared shape, for the launch checks and the CUDA rule. Its fields are init() options of their
    #: own (``tp=2``, ``SLURMRT_TP``), and so is ``megatron_args``, Megatron-LM's command line, read in their place.
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @classmethod
    def resolve(cls, given: Mapping[str, Any], env: Mapping[str, str]) -> Options:
        own = {f.name for f in fields(cls)} - {"parallel"}
        shape = {f.name for f in fields(ParallelConfig)} | {"megatron_args"}
        unknown = sorted(set(given) - own - shape)
        if unknown:
            raise TypeError(f"slurmrt.init() got unknown options {unknown}; known: {sorted(own | shape)}")
        values: dict[str, Any] = {}
        for name in sorted(own | shape):
            if name in given and given[name] is not None:
                values[name] = _convert(name, given[name])
                continue
            raw = env.get(f"SLURMRT_{name.upper()}")
            if raw is not None and raw != "":
                values[name] = _convert(name, raw)
        declared = {k: values.pop(k) for k in shape if k in values}
        return cls(parallel=ParallelConfig.declared(env, **declared), **values)


_PATHS = {"checkpoint_dir", "kill_switch", "event_log"}
_INTS = {"keep_last", "keep_every", "save_threads", "max_restarts", "max_excluded_nodes", "max_futile_runs", "nnodes",
         "gpus_per_node", "tp", "pp", "cp"}
_FLOATS = {"deadline_margin_s", "save_time_s", "kill_wait_s", "kill_switch_poll_s", "end_time_refresh_s",
           "hang_timeout_s", "progress_s", "hang_floor_s", "startup_timeout_s"}
_OPTIONAL = {"max_restarts", "max_futile_runs", "keep_every"}
_BOOLS = {"requeue", "deadline", "watchdog", "health_check", "fsdp", "moe_overlap"}


def _convert(name: str, value: Any) -> Any:
    try:
        if name in _PATHS:
            return Path(os.path.expanduser(str(value)))
        if name in _INTS:
            if name in _OPTIONAL and isinstance(value, str) and value.lower() in {"none", "off", "never"}:
                return None
            return int(value)
        if name in _FLOATS:
            if isinstance(value, str) and value.lower() in {"none", "off", "never"}:
                return None
            return float(value)
        if name in _BOOLS:
            return truthy(value) if isinstance(value, str) else bool(value)
        if name == "signals":
            items = value.replace(",", " ").split() if isinstance(value, str) else value
            return tuple(parse_signal(s) for s in items)
        if name == "megatron_args":
            return tuple(str(a) for a in value) if isinstance(value, Sequence) and not isinstance(value, str) else \
                tuple(str(value).split())
    except (TypeError, ValueError) as err:
        raise ConfigError(f"option {name}={value!r} is invalid: {err}", option=name, value=value) from None
    return value
