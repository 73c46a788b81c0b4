"""12. The control plane at scale: the agreement's rounds, connections and set-up, measured and modelled.

Measured (``_scale_worker.py``) on 2 to 16 gloo ranks of this machine: for the design before issue 24 (a gloo group
of every rank, made eagerly, a ring all-reduce) and for :class:`slurmrt._tree.Tree` (recursive doubling over 2-rank
pairs), each process's sockets, its store requests to make the group, and the median time of a round (the
agreement's 17 int64, MAX), rounds alternating between the two. Then the work group's sockets, made lazily, after the
collectives of a save and a resume.

Modelled beyond: a discrete-event model of one round. Every exchange takes a latency drawn from the 2-rank
measurement (one hop: what a pair costs when each process has its own core, as on a cluster); a rank's next
exchange starts when both partners are ready. The tree follows :func:`slurmrt._tree.partners` exactly; the ring
does gloo's 2(N - 1) steps, each waiting for the neighbour's message. Connections per process and store requests
follow from the schedule and the measured requests per peer.
"""

from __future__ import annotations

import shutil
import tempfile
from statistics import median
from typing import Any

from ._common import HERE, Section, run_ranks, table

WORKER = HERE / "_scale_worker.py"


def _model_tree(size: int, samples: Any, gen: Any) -> float:
    import torch

    p = 1 << (size.bit_length() - 1)
    t = torch.zeros(size, dtype=torch.float64)

    def draw(n: int) -> Any:
        return samples[torch.randint(len(samples), (n,), generator=gen)]

    def fold() -> None:
        if size > p:
            extra = torch.arange(p, size)
            done = torch.maximum(t[extra - p], t[extra]) + draw(len(extra))
            t[extra - p] = done
            t[extra] = done

    fold()
    idx = torch.arange(p)
    for k in range(p.bit_length() - 1):
        partner = idx ^ (1 << k)
        latency = draw(p)
        latency = latency[torch.minimum(idx, partner)]  # one exchange, one latency for both of the pair
        t[:p] = torch.maximum(t[:p], t[partner]) + latency
    fold()
    return float(t.max())


def _model_ring(size: int, samples: Any, gen: Any) -> float:
    import torch

    t = torch.zeros(size, dtype=torch.float64)
    for _ in range(2 * (size - 1)):  # reduce-scatter, then all-gather: each step waits for the left neighbour
        t = torch.maximum(t, t.roll(1)) + samples[torch.randint(len(samples), (size,), generator=gen)]
    return float(t.max())


def _tree_law(size: int) -> tuple[int, int]:
    """The most hops and peers of any rank."""
    from slurmrt._tree import partners

    p = 1 << (size.bit_length() - 1)
    ranks = {0, p - 1, size - 1} | ({size - p} if size > p else set())
    return max(len(partners(r, size)) for r in ranks), max(len(set(partners(r, size))) for r in ranks)


def run(quick: bool = False) -> Section:
    import torch

    sizes = (2, 4, 8) if quick else (2, 4, 8, 16)
    rounds = 30 if quick else 200
    measured: dict[int, list[dict[str, Any]]] = {}
    for size in sizes:
        where = tempfile.mkdtemp(prefix="slurmrt-scale-")
        try:
            measured[size] = run_ranks(WORKER, size, [str(rounds)], timeout=900,
                                       extra_env={"SLURMRT_BENCH_SCALE_DIR": where})
        finally:
            shutil.rmtree(where, ignore_errors=True)
    rows = []
    for size, results in measured.items():
        top = {k: max(r[k] for r in results) for k in ("full_sockets", "full_requests", "tree_sockets",
                                                        "tree_requests", "tree_hops", "groups_sockets_used")}
        ring = max(r["ring_round_s"] for r in results)
        tree = max(r["tree_round_s"] for r in results)
        rows.append([size, 2 * (size - 1), top["tree_hops"], f"{ring * 1e3:.2f}", f"{tree * 1e3:.2f}",
                     2 * top["full_sockets"], top["groups_sockets_used"],
                     2 * top["full_requests"], top["tree_requests"]])
    body = table(["ranks", "ring hops", "tree hops (most of any rank)", "ring round ms", "tree round ms",
                  "sockets before (2 full groups)", "sockets now (2 trees + lazy work group)",
                  "store requests before", "store requests now (one tree)"], rows)
    body += ("\n\nMeasured, per process, the most of any rank. Round: median of the rounds, the slowest rank's; "
             "both designs polled alike, alternating. Sockets now: all that slurmrt opens (the agreement's tree, "
             "the work group's tree and its lazy gloo group), after one all_ok, "
             "gather and broadcast (a save's and a resume's; not DCP's own collectives, which gather to rank 0 on "
             "the lazy group). With "
             "more processes than the 2 cores, a hop also waits for its partner to be scheduled: the measured "
             "rounds here say more about the machine than about the designs.\n\n")
    sharded_rows = [[size, results[0]["sharded_sockets"], max(r["sharded_sockets"] for r in results[1:]),
                     results[0]["dcp_save_sockets"], max(r["dcp_save_sockets"] for r in results[1:])]
                    for size, results in measured.items()]
    body += table(["ranks", "slurmrt's sharded save and resume: new sockets, rank 0",
                   "the other ranks (most)", "then dcp.save on the work group's gloo group: new sockets, rank 0",
                   "the other ranks (most)"], sharded_rows)
    body += ("\n\nA DTensor state saved and resumed through slurmrt's checkpoint store after the collectives above, "
             "then the same state through `dcp.save` on the work group's lazily connecting gloo group, as slurmrt "
             "saved sharded state before: DCP's planning gathers every rank's plan to rank 0, which connects to "
             "every rank. slurmrt's saves and loads run no DCP collective: each rank plans its own shards, and its "
             "DCP metadata reaches rank 0 over the work group's tree with the manifest's file list.\n\n")
    figures_sharded = {size: row[1:] for size, row in zip(measured, sharded_rows, strict=True)}

    # The model, from the 2-rank hop.
    samples = torch.tensor(sum((r["tree_samples_s"] for r in measured[2]), []), dtype=torch.float64)
    # A 2-rank ring round is 2 of the ring's steps: half of one is a step, inside one collective.
    ring_steps = torch.tensor(sum((r["ring_samples_s"] for r in measured[2]), []), dtype=torch.float64) / 2
    gen = torch.Generator().manual_seed(0)
    per_peer = median(r["tree_requests"] / max(1, r["tree_peers"]) for rs in measured.values() for r in rs)
    full_per_rank = {size: max(r["full_requests"] for r in rs) for size, rs in measured.items()}
    model_rows = []
    figures: dict[str, Any] = {"hop_s": float(samples.median()), "ring_step_s": float(ring_steps.median()),
                               "sharded_sockets": figures_sharded}
    for size in (2, 16, 1024, 16384):
        hops, peers = _tree_law(size)
        tree_s = median(_model_tree(size, samples, gen) for _ in range(5))
        ring_s = _model_ring(size, ring_steps, gen) if size <= (1024 if quick else 16384) else float("nan")
        figures[f"model_{size}"] = {"tree_s": tree_s, "ring_s": ring_s, "hops": hops, "peers": peers}
        model_rows.append([size, 2 * (size - 1), hops, f"{ring_s * 1e3:.1f}", f"{tree_s * 1e3:.2f}",
                           f"{ring_s / tree_s:.0f}x", 2 * size, 2 * peers + 3,
                           f"{2 * size * (2 * size + 1):,}", f"{int(2 * size * peers * per_peer):,}"])
    body += table(["ranks", "ring hops", "tree hops", "ring round ms (model)", "tree round ms (model)",
                   "ring / tree", "sockets per process before", "sockets per process now (non-coordinator)",
                   "store requests to set up, before (all ranks)", "now (all ranks, 2 trees)"], model_rows)
    body += (f"\n\nModel: a tree hop takes {float(samples.median()) * 1e6:.0f} µs (the median of the 2-rank tree "
             f"rounds measured above, {len(samples)} of them: one hop each), a ring step "
             f"{float(ring_steps.median()) * 1e6:.0f} µs (half a 2-rank ring round: two steps inside one "
             "collective); each exchange draws its latency from those rounds. Sockets before: two groups of every "
             "rank (N - 1 connections and a listener each). Now: two trees (the agreement's, and the work group's "
             "for its agreements, broadcasts and gathers), each with its peers (at most log2(N) + 1), one listener "
             "for both (they share a gloo device), and the lazy gloo group's listener. Rank 0 is no longer a "
             "coordinator that connects to every rank: sharded saves and loads run no DCP collective (measured "
             "above). Store "
             f"requests: before, each rank of each eager group made 2N + 1 (measured: {full_per_rank}); now "
             f"{per_peer:.0f} per peer of a tree, and the lazy group's connections ask the store only for the peers "
             "they reach.")
    return Section("The control plane at scale", body, figures)
