"""Bad nodes remembered across jobs: one ledger per user and per cluster.

A node that failed a health check, hung, or was lost in one job is likely to fail the next job too, and Slurm does
not know (it may still call the node IDLE). slurmrt writes it down when its recovery leaves a node out, in
``$XDG_STATE_HOME/slurmrt/bad-nodes-<cluster>.json`` (``~/.local/state/...``; ``SLURMRT_NODE_LEDGER`` names
another file): a home directory every node of a cluster sees, private to the user.

What reads it:

- the requeue: the job's ``ExcNodeList`` gets the ledger's nodes too, after the run's own, within
  ``max_excluded_nodes`` (:mod:`slurmrt.recovery.executor`);
- ``slurmrt run``: a step is placed on the other nodes of the allocation first; a ledger node is a last-resort
  spare;
- ``slurmrt nodes``: lists the ledger, clears entries, and prints ``--exclude=...`` for ``sbatch``.

An entry holds the reason, the job and the times it was first and last seen, and how often. It expires
``TTL_S`` (24 h) after it was last seen, so that a repaired node comes back by itself. Writes are atomic (a reader
sees the old file or the new one) and locked (two jobs that both lose a node lose neither record); a damaged ledger
is a warning and is rewritten, never a failed job.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import _clock
from .. import _figures as figures
from .._safefs import locked_file, read_capped, replace_text

__all__ = ["LEDGER_ENV", "TTL_S", "Entry", "Ledger", "ledger_path"]

logger = logging.getLogger(__name__)

LEDGER_ENV = "SLURMRT_NODE_LEDGER"
#: An entry is forgotten this long after it was last seen.
TTL_S = 24 * 3600.0
_MAX_BYTES = 4 << 20
_LOCK_WAIT_S = 10.0


@dataclass(frozen=True)
class Entry:
    node: str
    reason: str
    job: str | None
    first: float  #: wall time it was first written down
    last: float  #: wall time it was last seen failing
    count: int = 1

    @classmethod
    def parse(cls, node: str, data: Any) -> Entry | None:
        if not isinstance(data, dict):
            return None
        first, last = figures.epoch(data.get("first")), figures.epoch(data.get("last"))
        count = figures.count(data.get("count", 1), 1)
        if first is None or last is None or count is None or not isinstance(data.get("reason"), str):
            return None  # a time out of the clock's range, a count of 1e999: not an entry slurmrt wrote
        return cls(node, data["reason"], None if data.get("job") is None else str(data["job"]), first, last, count)


def ledger_path(env: Mapping[str, str], cluster: str | None) -> Path:
    """Where this user's ledger for ``cluster`` lives (:data:`LEDGER_ENV` wins)."""
    if env.get(LEDGER_ENV):
        return Path(env[LEDGER_ENV]).expanduser()
    state = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in (cluster or "local"))
    return state / "slurmrt" / f"bad-nodes-{name}.json"


class Ledger:
    def __init__(self, path: Path, *, ttl_s: float = TTL_S) -> None:
        self.path = path
        self.ttl_s = ttl_s

    @classmethod
    def of(cls, env: Mapping[str, str], cluster: str | None) -> Ledger:
        return cls(ledger_path(env, cluster))

    def entries(self) -> dict[str, Entry]:
        """The entries not yet expired, by node; none when there is no ledger (or it cannot be read: a warning)."""
        now = _clock.wall()
        return {n: e for n, e in self._read().items() if now - e.last <= self.ttl_s}

    def nodes(self) -> list[str]:
        """The ledger's nodes, the most recently seen first."""
        return [e.node for e in sorted(self.entries().values(), key=lambda e: -e.last)]

    def record(self, nodes: Iterable[str], *, reason: str, job: str | None) -> None:
        """Write ``nodes`` down (or again: seen once more, its expiry starts over). Never raises: a job that cannot
        write its ledger goes on, with a warning."""
        nodes = [n for n in dict.fromkeys(nodes) if n]
        if not nodes:
            return
        try:
            with self._locked():
                now = _clock.wall()
                entries = self.entries()
                for node in nodes:
                    old = entries.get(node)
                    entries[node] = Entry(node, reason, job, old.first if old else now, now,
                                          old.count + 1 if old else 1)
                self._write(entries)
        except OSError as err:
            logger.warning("cannot write the bad-node ledger %s (%s): %s not remembered for the next job",
                           self.path, err, ", ".join(nodes))

    def clear(self, nodes: Iterable[str] | None = None) -> list[str]:
        """Forget ``nodes`` (None: every node); the nodes that were forgotten."""
        with self._locked():
            entries = self.entries()
            gone = list(entries) if nodes is None else [n for n in nodes if n in entries]
            for node in gone:
                del entries[node]
            self._write(entries)
        return gone

    def _read(self) -> dict[str, Entry]:
        # Shape: read, then each way another user's file can be wrong, said and left out
        try:
            data = json.loads(read_capped(self.path, _MAX_BYTES, own=True))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as err:
            logger.warning("bad-node ledger %s cannot be read (%s): it is ignored, and rewritten at the next "
                           "record", self.path, err)
            return {}
        raw = data.get("nodes") if isinstance(data, dict) else None
        entries = {node: Entry.parse(node, value) for node, value in (raw or {}).items()} \
            if isinstance(raw, dict) else {}
        bad = sorted(node for node, e in entries.items() if e is None)
        if bad:
            logger.warning("bad-node ledger %s: the entries of %s are not what slurmrt writes (a time out of range, a "
                           "count of 1e999, ...): ignored", self.path, ", ".join(bad[:8]))
        return {node: e for node, e in entries.items() if e is not None}

    def _write(self, entries: dict[str, Entry]) -> None:
        record = {"version": 1, "nodes": {n: {k: v for k, v in asdict(e).items() if k != "node"}
                                          for n, e in sorted(entries.items())}}
        replace_text(self.path, json.dumps(record, indent=1) + "\n")

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return locked_file(self.path.with_name(f".{self.path.name}.lock"), timeout_s=_LOCK_WAIT_S, mode=0o600)
