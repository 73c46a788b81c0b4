"""The evidence ``slurmrt run`` gathers about a fault before it decides: whether Slurm still counts each suspect node
in the job, and a health check of each run on that node from outside the failed processes (``srun --overlap``,
:mod:`.probe`), and which nodes were suspects of a hang earlier in the job. :func:`~.plan.classify` turns it into a
class; the plan decides from that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .plan import FaultClass, NodeEvidence, Trigger, classify

__all__ = ["PROBE_TIMEOUT_S", "Evidence", "probe_command"]

#: How long the health check of the suspect nodes may take: a node that does not answer by then fails it.
PROBE_TIMEOUT_S = 60.0


def probe_command(srun: str, job: str, nodes: Sequence[str], checkpoint_dir: Path | None) -> list[str]:
    n = len(nodes)
    return [srun, "--overlap", f"--jobid={job}", f"--nodes={n}", f"--nodelist={','.join(nodes)}", f"--ntasks={n}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", sys.executable, "-m", "slurmrt.recovery.probe",
            *([str(checkpoint_dir)] if checkpoint_dir is not None else [])]


def parse_probe(stdout: str, nodes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each node's findings from the probe's output (one JSON line per node); a node that said nothing failed."""
    found: dict[str, tuple[str, ...]] = {}
    for line in stdout.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("node") in nodes and isinstance(data.get("failures"), list):
            found[data["node"]] = tuple(str(f) for f in data["failures"])
    return {n: found.get(n, ("did not answer its health check (srun --overlap)",)) for n in nodes}


@dataclass
class Evidence:
    """Gathers and keeps the evidence of one job's faults (one per ``slurmrt run``)."""

    srun: str
    job: str
    env: Mapping[str, str]
    checkpoint_dir: Path | None = None
    timeout_s: float = PROBE_TIMEOUT_S
    #: Hangs each node was a suspect of, in this job so far.
    hangs: dict[str, int] = field(default_factory=dict)

    def judge(self, trigger: Trigger, suspects: Sequence[str], held: Sequence[str]
              ) -> tuple[FaultClass, tuple[str, ...], list[NodeEvidence]]:
        """The fault's class, the nodes to leave out, and the evidence, for ``suspects`` (``held``: the nodes Slurm
        counts in the job now)."""
        present = [n for n in suspects if n in held]
        health = self.check(present) if present else {}
        evidence = [NodeEvidence(n, n in held, health.get(n, ()), self.hangs.get(n, 0)) for n in suspects]
        fault, bad = classify(trigger, evidence)
        if trigger is Trigger.HANG:
            for n in present:
                self.hangs[n] = self.hangs.get(n, 0) + 1
        return fault, bad, evidence

    def check(self, nodes: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The health check on each of ``nodes``, one ``srun --overlap`` task per node, at once."""
        argv = probe_command(self.srun, self.job, nodes, self.checkpoint_dir)
        try:
            done = subprocess.run(argv, env=dict(self.env), capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
            return parse_probe(out, nodes)
        except OSError as err:
            return {n: (f"its health check could not start: {err}",) for n in nodes}
        return parse_probe(done.stdout, nodes)
