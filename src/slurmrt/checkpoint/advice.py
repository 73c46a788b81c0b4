"""What ``rt.should_save`` would answer for a job that ran, for ``slurmrt status`` (text and ``--json``): its
measured stalls, its failure history and the intervals :mod:`slurmrt.checkpoint.cadence` would choose from them."""

from __future__ import annotations

from typing import Any

from .cadence import History, expected_stall, intervals

__all__ = ["advice", "saving"]


def saving(events: list[dict[str, Any]], *, node_h: float) -> dict[str, Any] | None:
    """The figures behind :func:`advice` (``slurmrt status --json``): the measured save stalls (the mean of the last
    three per tier), the failure history, and the intervals ``rt.should_save`` would choose, in seconds and, when
    the job measured its step, in steps; None when it measured no save."""
    from ..record.events import Event

    shared, local, written = _measured(events)
    if shared is None:
        return None
    nodes = max((int(e["nnodes"]) for e in events if e.get("event") == Event.INIT.value
                 and isinstance(e.get("nnodes"), int)), default=1)
    history = History.of(events)
    plan = intervals(history, shared_cost_s=shared, local_cost_s=local, node_h=node_h, nodes=nodes,
                     shared_write_s=written)
    steps = [float(e["step_s"]) for e in events if e.get("event") == Event.PROGRESS.value
             and isinstance(e.get("step_s"), (int, float)) and e["step_s"] > 0]
    step_s = steps[-1] if steps else None

    def in_steps(t: float | None) -> int | None:
        return None if t is None or step_s is None else max(1, round(t / step_s))

    mtbf = history.mtbf_s(node_h=node_h, nodes=nodes)
    return {"shared_save_s": shared, "local_save_s": local, "failures": history.failures,
            "exposure_s": history.exposure_s, "mtbf_s": mtbf, "own_rate": mtbf == history.own_s(),
            "prior_node_h": node_h, "nodes": nodes, "step_s": step_s,
            "shared_every_s": plan.shared_s, "shared_every_steps": in_steps(plan.shared_s),
            "local_every_s": plan.local_s, "local_every_steps": in_steps(plan.local_s)}


def _measured(events: list[dict[str, Any]]) -> tuple[float | None, float | None, float | None]:
    """Each tier's expected stall (shared, local), and a shared save's whole time, its write included: the mean of
    the last three of each; None where none was measured."""
    from ..record.events import Event, stall

    saves = [e for e in events if e.get("event") == Event.SAVE.value]

    def of(tier: str) -> list[dict[str, Any]]:
        return [e for e in saves if e.get("tier", "shared") == tier]

    def stalls(tier: str) -> float | None:
        return expected_stall([s for s in map(stall, of(tier)) if s is not None])

    writes = [float(e["seconds"]) for e in of("shared") if isinstance(e.get("seconds"), (int, float))]
    return stalls("shared"), stalls("local"), expected_stall(writes)


def advice(events: list[dict[str, Any]], *, node_h: float) -> list[str]:
    """What ``rt.should_save`` would answer for a job, in words (``slurmrt status``): the intervals for its measured
    saves and its failure history; none when it measured no save. For a loop that cannot ask (Megatron-LM's
    ``--save-interval``), the steps to set."""
    from ..record.chart import duration as _duration

    s = saving(events, node_h=node_h)
    if s is None:
        return []

    def every(tier: str) -> str:
        steps = s[f"{tier}_every_steps"]
        return _duration(s[f"{tier}_every_s"]) + (f" (about {steps} steps)" if steps is not None else "")

    prior = f"a prior of 1 in {node_h:g} node-hours over {s['nodes']} node(s)"
    weighed = f"its own rate, shorter than {prior}" if s["own_rate"] else f"and {prior}"
    head = (f"saving: saves of {s['shared_save_s']:.3g} s; a failure every {_duration(s['mtbf_s'])}"
            f" ({s['failures']} in {_duration(s['exposure_s'])}, {weighed})")
    said = f"  rt.should_save: a shared save every {every('shared')} of training"
    return [head, said + (f", a local one every {every('local')}" if s["local_every_s"] is not None else "")]
