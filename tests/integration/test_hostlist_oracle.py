"""Hostlists against the real `scontrol show hostnames` / `show hostlist` on generated expressions (the oracle)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest

from slurmrt import HostlistError, hostlist


def _random_expression(rng: random.Random) -> str:
    """Valid and invalid expressions of the shapes real nodelists have (and their typos)."""
    entries = []
    for _ in range(rng.randint(1, 3)):
        prefix = rng.choice(["n", "gpu", "node-", "a", "x1y", "10.0.0.", ""])
        groups = []
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            parts = []
            for _ in range(rng.randint(1, 3)):
                lo = rng.randint(0, 120)
                width = rng.choice([1, 1, 2, 3])
                part = f"{lo:0{width}d}"
                if rng.random() < 0.6:
                    part += f"-{lo + rng.randint(-2, 12):0{width}d}"
                parts.append(part)
            groups.append("[" + ",".join(parts) + "]")
        entry = prefix + "".join(g + (rng.choice(["", "-", "b"]) if i < len(groups) - 1 else "")
                                 for i, g in enumerate(groups))
        if not groups:
            entry += str(rng.randint(0, 99))
        if rng.random() < 0.1:
            entry += rng.choice(["x", "]", "[1"])
        entries.append(entry)
    return rng.choice([",", ",", " "]).join(entries)


def _scontrol_env(tmp: Path) -> dict[str, str]:
    # scontrol reads slurm.conf even to expand names; a minimal one is enough and contacts no daemon.
    conf = tmp / "slurm.conf"
    conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def _random_hosts(rng: random.Random) -> list[str]:
    """Lists shaped like real allocations: runs of consecutive numbers, padded or not, several prefixes, gaps."""
    hosts: list[str] = []
    for _ in range(rng.randint(1, 4)):
        prefix = rng.choice(["n", "gpu", "node-", "x1y", "a"])
        width = rng.choice([0, 2, 3, 4])
        start = rng.randint(0, 130)
        for number in range(start, start + rng.randint(1, 15)):
            if rng.random() < 0.8:
                hosts.append(f"{prefix}{number:0{width}d}" if width else f"{prefix}{number}")
    return hosts


def test_expand_agrees_with_scontrol_on_generated_expressions(tmp_path: Path, scontrol: str) -> None:
    env = _scontrol_env(tmp_path)
    rng = random.Random(20261121)
    checked = rejected = 0
    for _ in range(300):
        expr = _random_expression(rng)
        out = subprocess.run([scontrol, "show", "hostnames", expr], capture_output=True, text=True, env=env,
                             check=False)
        # scontrol sometimes reports an error on stderr yet prints the other entries (a backwards range in a
        # non-last bracket group drops that entry silently from stdout): a rejection for us, never a shorter list.
        scontrol_rejects = "Invalid hostlist" in out.stdout + out.stderr or "error:" in out.stderr
        if expr.count("[") != expr.count("]"):
            # An unclosed bracket or a stray "]": scontrol prints garbage ("n[1-2" gives "n]") or keeps the "]" in a
            # host name that cannot exist; we raise instead.
            with pytest.raises(HostlistError):
                hostlist.expand(expr)
            rejected += 1
            continue
        if scontrol_rejects:
            with pytest.raises(HostlistError):
                hostlist.expand(expr)
            rejected += 1
        else:
            assert hostlist.expand(expr) == out.stdout.split(), expr
            checked += 1
    assert checked > 100 and rejected > 20, (checked, rejected)


def test_compress_agrees_with_scontrol_show_hostlist_on_generated_lists(tmp_path: Path, scontrol: str) -> None:
    env = _scontrol_env(tmp_path)
    rng = random.Random(20261122)
    for _ in range(300):
        hosts = _random_hosts(rng)
        out = subprocess.run([scontrol, "show", "hostlist", ",".join(hosts)], capture_output=True, text=True,
                             env=env, check=True)
        assert hostlist.compress(hosts) == out.stdout.strip(), hosts
