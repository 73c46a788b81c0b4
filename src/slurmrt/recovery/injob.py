"""In-job restart: the request a failed step leaves for ``slurmrt run``, which replaces the step on a spare node.

``slurmrt run --spare-nodes S -- CMD`` (:mod:`slurmrt.recovery.supervisor`) starts the training step on all but
``S`` of the job's nodes and tells its processes so through the environment
(:func:`slurmrt.recovery.facts.in_job_from_environ`). When the plan (:mod:`slurmrt.recovery.plan`) chooses an in-job
restart, the rank that acts writes the request here (the nodes to leave out); the supervisor reads it once the step
has ended and starts the next step without those nodes.

The supervisor's directory is created by it, ours and 0700 (:func:`slurmrt._safefs.private_dir`); a request file is
created with ``O_EXCL``, one per attempt, so a planted or stale file is never read as this step's request.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._rules import convert, rule_of
from .._safefs import open_new, private_dir, read_capped, replace_text
from .facts import POLICY, InJob
from .settings import RecoverySection

__all__ = ["KINDS", "EndedReader", "clear_records", "ended_path", "facts_path", "read_ended", "read_facts",
           "read_request", "request_path", "share_facts", "write_ended", "write_request"]

logger = logging.getLogger(__name__)


#: Every kind of record a step and ``slurmrt run`` leave in the run directory, each ``<kind>-<attempt>.json``: the
#: attempt restarts at 0 in every run of the job, so a record a killed supervisor left would pass for this run's.
KINDS = ("request", "facts", "ended", "word")
_RECORD = re.compile(rf"(?:{'|'.join(KINDS)})-\d+\.json")


def clear_records(directory: Path) -> list[str]:
    """Remove every record of :data:`KINDS` in ``directory`` (``slurmrt run``, as it starts: none of them can be
    this run's yet); returns the names removed."""
    removed = []
    for path in directory.iterdir():
        if _RECORD.fullmatch(path.name) and (path.is_symlink() or not path.is_dir()):  # a link goes, not its target
            path.unlink()
            removed.append(path.name)
    return sorted(removed)


def request_path(directory: Path, attempt: int) -> Path:
    return directory / f"request-{attempt}.json"


def write_request(sup: InJob, data: dict[str, Any]) -> str | None:
    """The request file, created once (``O_EXCL``) in the supervisor's private directory; why not, or None."""
    try:
        private_dir(sup.directory)  # exists, ours, 0700: checked, not created by a rank
        fd = open_new(request_path(sup.directory, sup.attempt))
        try:
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except FileExistsError:  # another rank asked first (ranks of one node that failed its health check)
        if read_request(sup.directory, sup.attempt) is not None:
            return None
        return f"{request_path(sup.directory, sup.attempt)} exists and is not a request slurmrt wrote"
    except Exception as err:  # an unsafe or unreachable directory: the requeue still works
        return f"cannot leave the request in {sup.directory}: {err}"
    return None


def read_request(directory: Path, attempt: int) -> dict[str, Any] | None:
    """The step's request (``slurmrt run``'s side), or None: none, or not a well-formed one (reported)."""
    path = request_path(directory, attempt)
    try:
        data = json.loads(read_capped(path, 1 << 20))  # a regular file of a few hundred bytes, nothing else
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.error("in-job restart request %s unreadable: %s", path, err)
        return None
    if not (isinstance(data, dict) and data.get("attempt") == attempt and isinstance(data.get("exclude"), list)
            and all(isinstance(n, str) and n for n in data["exclude"])):
        logger.error("in-job restart request %s is not one slurmrt writes: %r", path, data)
        return None
    return data


# -- the training's resolved options, for `slurmrt run` ---------------------------------------------------------------
#: What ``share_facts`` writes: each name and the types its value may have.
_FACTS: dict[str, tuple[type, ...]] = {"event_log": (str, type(None)), "checkpoint_dir": (str, type(None)),
                                       "requeue": (bool,), "max_restarts": (int, type(None)),
                                       "max_futile_runs": (int, type(None)), "max_excluded_nodes": (int,)}
#: The names among them that are paths: written absolute, and refused otherwise (a relative path is the training's
#: working directory's, which the supervisor cannot know).
_PATHS = ("event_log", "checkpoint_dir")


def facts_path(directory: Path, attempt: int) -> Path:
    return directory / f"facts-{attempt}.json"


def share_facts(sup: InJob, facts: dict[str, Any]) -> None:
    """Rank 0, at ``init()``: the options the training resolved (``checkpoint_dir=`` and the rest passed in code),
    for ``slurmrt run``, which would otherwise know only the environment's. Never raises: the supervisor then goes
    on with the environment, and says so."""
    try:
        data = {k: (os.path.abspath(v) if k in _PATHS and v is not None else v) for k, v in facts.items()
                if k in _FACTS}
        private_dir(sup.directory)
        fd = open_new(facts_path(sup.directory, sup.attempt))
        try:
            os.write(fd, json.dumps({"attempt": sup.attempt, **data}).encode())
        finally:
            os.close(fd)
    except Exception as err:  # noqa: BLE001 - the training goes on; the supervisor uses the environment
        logger.warning("cannot tell slurmrt run this run's options in %s: %s", sup.directory, err)


def newest_facts(directory: Path) -> dict[str, Any] | None:
    """The options the newest step's training resolved, for a reader that comes after ``slurmrt run`` is gone (the
    guard, once the batch node failed); None: none there, or none well formed."""
    try:
        attempts = sorted((int(m.group(1)) for p in directory.iterdir()
                           if (m := re.fullmatch(r"facts-(\d{1,9})\.json", p.name))), reverse=True)
    except OSError:
        return None
    return next((data for a in attempts if (data := read_facts(directory, a)) is not None), None)


def read_facts(directory: Path, attempt: int) -> dict[str, Any] | None:
    """The options step ``attempt``'s training resolved, or None: none written (killed before ``init()``), or not
    a well-formed record (reported)."""
    path = facts_path(directory, attempt)
    try:
        data = json.loads(read_capped(path, 1 << 16))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as err:
        logger.error("the training's options %s unreadable: %s", path, err)
        return None
    if not _well_formed(data, attempt):
        logger.error("the training's options %s are not what slurmrt writes: %r", path, data)
        return None
    return {k: data[k] for k in _FACTS}


def _well_formed(data: Any, attempt: int) -> bool:
    """Every name of :data:`_FACTS`, each of its types (a flag is no count), its paths absolute, for ``attempt``;
    the recovery options within their own rules (the options' one validator, ``_rules.convert``)."""
    if not isinstance(data, dict) or data.get("attempt") != attempt or not set(_FACTS) <= set(data):
        return False
    for name, types in _FACTS.items():
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return False
    return _within_rules(data)


def _within_rules(data: dict[str, Any]) -> bool:
    """The record's paths absolute, its recovery options within their rules."""
    return all(data[k] is None or os.path.isabs(data[k]) for k in _PATHS) and \
        all(_by_rule(name, data[name]) for name in POLICY)


def _by_rule(name: str, value: Any) -> bool:
    """``value`` is what option ``name`` may be (None only where the option takes "none")."""
    rule = rule_of(RecoverySection, name)
    if value is None:
        return rule.optional
    try:
        convert(name, rule, value)
    except ConfigError:
        return False
    return True


# -- the tasks srun saw end, for the step's ranks ---------------------------------------------------------------------
def ended_path(directory: Path, attempt: int) -> Path:
    return directory / f"ended-{attempt}.json"


def write_ended(directory: Path, attempt: int, ended: dict[int, tuple[str, str]]) -> None:
    """``slurmrt run``'s side: the step's tasks that srun saw end so far (task id: its node, how it ended), replaced
    whole each time, so that a rank reads all of them or none. Never raises: the ranks then wait for the census."""
    data = {"attempt": attempt, "tasks": {str(t): {"node": n, "how": h} for t, (n, h) in sorted(ended.items())}}
    try:
        replace_text(ended_path(directory, attempt), json.dumps(data))
    except OSError as err:
        logger.warning("cannot tell the step which tasks ended in %s: %s", directory, err)


def read_ended(directory: Path, attempt: int) -> dict[int, tuple[str, str]]:
    """The step's side: the tasks srun saw end (task id: node, how), or none (nothing ended, or not a record
    ``slurmrt run`` writes: reported)."""
    path = ended_path(directory, attempt)
    try:
        data = json.loads(read_capped(path, 1 << 22))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as err:
        logger.error("the tasks that ended, %s, unreadable: %s", path, err)
        return {}
    ended = _ended_record(data, attempt)
    if ended is None:
        logger.error("the tasks that ended, %s, are not what slurmrt writes", path)
        return {}
    return ended


class EndedReader:
    """The step's side, for a rank: the tasks srun saw end (:func:`read_ended`), read at most every ``every_s``, the
    last reading kept between two (:attr:`last`). None without ``slurmrt run`` (``sup`` None), or when srun's tasks
    are not the ranks (``tasks_are_ranks`` false: a launcher per node)."""

    def __init__(self, sup: InJob | None, *, tasks_are_ranks: bool, every_s: float = 0.5) -> None:
        self._sup = sup if tasks_are_ranks else None
        self._every_s = every_s
        self._read_at = float("-inf")
        self.last: dict[int, tuple[str, str]] = {}  #: the last reading (task id: node, how)

    def __call__(self) -> dict[int, tuple[str, str]]:
        if self._sup is not None and time.monotonic() - self._read_at >= self._every_s:
            self._read_at, self.last = time.monotonic(), read_ended(self._sup.directory, self._sup.attempt)
        return self.last


def _ended_record(data: Any, attempt: int) -> dict[int, tuple[str, str]] | None:
    """The tasks of a record :func:`write_ended` wrote for ``attempt``; None for anything else."""
    tasks = data.get("tasks") if isinstance(data, dict) and data.get("attempt") == attempt else None
    if not isinstance(tasks, dict):
        return None
    ended = {}
    for key, value in tasks.items():
        if not (key.isdigit() and isinstance(value, dict) and isinstance(value.get("node"), str)
                and isinstance(value.get("how"), str)):
            return None
        ended[int(key)] = (value["node"], value["how"])
    return ended
