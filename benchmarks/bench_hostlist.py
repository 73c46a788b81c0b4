"""7. Hostlists: expanding and compressing a 10,000-node list, against python-hostlist in the same run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from slurmrt import hostlist

from ._common import Section, table

EXPR = "gpu[00001-05000],cpu[1-4000],a[1-10]b[1-100]"  # 10,000 names, three shapes


def _best(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(quick: bool = False) -> Section:
    import hostlist as python_hostlist  # python-hostlist, the comparator (pip install python-hostlist)

    repeats = 5 if quick else 20
    hosts = hostlist.expand(EXPR)
    assert len(hosts) == 10_000
    assert sorted(python_hostlist.expand_hostlist(EXPR)) == sorted(hosts)
    ours_e = _best(lambda: hostlist.expand(EXPR), repeats)
    theirs_e = _best(lambda: python_hostlist.expand_hostlist(EXPR), repeats)
    ours_c = _best(lambda: hostlist.compress(hosts), repeats)
    theirs_c = _best(lambda: python_hostlist.collect_hostlist(hosts), repeats)
    rows = [["expand", f"{ours_e * 1000:.1f}", f"{theirs_e * 1000:.1f}", f"{theirs_e / ours_e:.1f}x"],
            ["compress", f"{ours_c * 1000:.1f}", f"{theirs_c * 1000:.1f}", f"{theirs_c / ours_c:.1f}x"]]
    body = table(["10,000 hosts", "slurmrt ms", "python-hostlist ms", "speed-up"], rows)
    body += (f"\n\n`{EXPR}`, medians of {repeats}. python-hostlist's `collect_hostlist` also sorts, which Slurm's "
             "compression (and ours) does not: it keeps the order so that expanding gives the same list back.")
    return Section("Hostlists", body, {"expand": (ours_e, theirs_e), "compress": (ours_c, theirs_c)})
