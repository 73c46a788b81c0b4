"""init() options: keyword arguments, each with a ``SLURMRT_*`` environment variable (docs/reference/environment.md),
declared once each, in the section of the package that uses it (``checkpoint/settings.py``, ``stop/settings.py``,
``hang/settings.py``, ``recovery/settings.py``, ``record/settings.py``, ``launch/settings.py``), and composed here.

An explicit argument wins over the environment, which wins over the default; every value is checked by its rule
(:mod:`slurmrt._rules`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ._rules import convert, rule_of
from .checkpoint.settings import CheckpointSection
from .hang.settings import HangSection
from .health.settings import HealthSection
from .launch.parallel import ParallelConfig
from .launch.settings import LaunchSection
from .launch.slurmvars import export_env
from .record.settings import RecordSection
from .recovery.settings import RecoverySection
from .stop.settings import StopSection

__all__ = ["DEPRECATED", "OTHER_VARIABLES", "SECTIONS", "Options", "dropped_by_export", "unknown_variables",
           "warn_unknown"]

#: Every section, in the order of the options' documentation.
SECTIONS = (CheckpointSection, StopSection, HangSection, HealthSection, RecoverySection, RecordSection,
            LaunchSection)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Options(CheckpointSection, StopSection, HangSection, HealthSection, RecoverySection, RecordSection,
              LaunchSection):
    """Every option: the packages' sections (:data:`SECTIONS`) composed, each option a keyword argument here and of
    ``init()``. A part takes only its own section, picked from this by the composers (``StopSection.of``)."""

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
        init()), then ``SLURMRT_*`` in ``env``, then the defaults; every value checked by its rule
        (``slurmrt._rules.convert``)."""
        if base is not None:
            given = {**base.explicit(), **given}
        own = {f.name for f in fields(cls)} - {"parallel"}
        shape = set(LaunchSection.SHAPE)
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
    rule = LaunchSection.SHAPE.get(name) or rule_of(Options, name)
    if given.get(name) is not None:
        return convert(name, rule, given[name])
    raw = env.get(f"SLURMRT_{name.upper()}")
    return convert(name, rule, raw) if raw else _UNSET


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
        found[new] = convert(old, rule_of(Options, new), raw)
    return found


#: ``SLURMRT_*`` variables that are not init() options, each read where it acts (docs/reference/environment.md).
OTHER_VARIABLES = frozenset({"SLURMRT_LOCK_FILE", "SLURMRT_ALLOW_NODE_RANK_REORDER", "SLURMRT_EVENT_COPY",
                             "SLURMRT_SIM_DIR", "SLURMRT_SIM_UNHEALTHY", "SLURMRT_SIM_NAN", "SLURMRT_CLUSTER_DIR",
                             "SLURMRT_BENCH_DIR", "SLURMRT_RUN_DIR", "SLURMRT_RUN_ATTEMPT", "SLURMRT_NODE_LEDGER"})


def warn_unknown(env: Mapping[str, str], *, lead: bool = True) -> None:
    """Say the ``SLURMRT_*`` variables slurmrt does not read; and, once (``lead``: rank 0), an export that kept the
    submitting shell's from the job (:func:`dropped_by_export`)."""
    for name in unknown_variables(env):
        logger.warning("%s is set but slurmrt reads no such variable (misspelt?): it has no effect", name)
    dropped = dropped_by_export(env) if lead else None
    if dropped:
        logger.warning("%s", dropped)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """The ``SLURMRT_*`` variables in ``env`` that slurmrt does not read: a misspelt one (``SLURMRT_KILLSWITCH``)
    would otherwise leave its protection off without a word."""
    known = {f"SLURMRT_{f.name.upper()}" for f in fields(Options) if f.name != "parallel"}
    known |= {f"SLURMRT_{name.upper()}" for name in LaunchSection.SHAPE}
    known |= {f"SLURMRT_{old.upper()}" for old in DEPRECATED}
    return sorted(k for k in env if k.startswith("SLURMRT_") and k not in known and k not in OTHER_VARIABLES)


def dropped_by_export(env: Mapping[str, str]) -> str | None:
    """Why NNODES and the ``SLURMRT_*`` options of the submitting shell may be missing, in words, or None: the job
    was submitted with ``--export=NONE`` or an export list (Slurm says which in ``SLURM_EXPORT_ENV``), and none of
    them is set here (a batch script that sets its own is fine)."""
    export = export_env(env)
    if not export or export.upper().split(",")[0] == "ALL":
        return None
    if "NNODES" in env or any(k.startswith("SLURMRT_") for k in env):
        return None
    return (f"the job was submitted with --export={export} (SLURM_EXPORT_ENV) and no NNODES or SLURMRT_* variable "
            "reached it: what the submitting shell set for slurmrt is not in force. Set them in the batch script "
            "(export SLURMRT_CHECKPOINT_DIR=...), or submit with --export=ALL,NAME=value")
