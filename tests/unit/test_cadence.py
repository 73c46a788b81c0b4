"""rt.should_save(step): Daly's interval from the measured save stall and the learned failure rate, the same answer
on every rank, and answers that move when the measurements do."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from slurmrt import _clock
from slurmrt._comm import SoloComm
from slurmrt.checkpoint.cadence import (
    LOCAL_OVERHEAD,
    MOST_OVERHEAD,
    WARMUP_STEPS,
    Cadence,
    History,
    Intervals,
    daly,
    insured,
    insurer,
    intervals,
)
from slurmrt.record.events import Event, EventLog
from slurmrt.record.runs import measured_earlier

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def ev(t: float, restart: int, event: str, attempt: int = 0, **kw: object) -> dict[str, object]:
    return {"time": (T0 + timedelta(seconds=t)).isoformat(), "event": event, "job": "12", "restart": restart,
            "attempt": attempt, "rank": 0, **kw}


def test_daly_is_youngs_square_root_for_small_saves_and_the_mtbf_for_huge_ones() -> None:
    for cost, mtbf in ((1.0, 36_000.0), (10.0, 3_600.0), (30.0, 10_800.0)):
        young = math.sqrt(2 * cost * mtbf)
        assert daly(cost, mtbf) == pytest.approx(young, rel=0.06)
        assert daly(cost, mtbf) < young + cost  # Daly takes the save itself out of the period
    assert daly(500.0, 100.0) == 100.0  # a save longer than two MTBFs: save once per MTBF
    assert daly(4.0, 3600) > daly(1.0, 3600) and daly(1.0, 7200) > daly(1.0, 3600)  # grows with C and M
    # four times the stall: about twice the interval (the square root)
    assert daly(40.0, 36_000.0) / daly(10.0, 36_000.0) == pytest.approx(2.0, rel=0.05)


def test_the_history_counts_the_runs_a_fault_cut_and_whether_the_local_tier_served_the_next() -> None:
    events = [
        ev(0, 0, "init"), ev(5, 0, "fresh_start"), ev(100, 0, "exit", outcome="HUNG", code=5, step=50),
        ev(110, 0, "init", attempt=1), ev(115, 0, "resume", attempt=1, step=40, tier="local"),
        ev(300, 0, "progress", attempt=1, step=200),  # killed: no exit (a lost node), 190 s after its start
        ev(400, 1, "init"), ev(405, 1, "resume", step=190, tier="shared"),
        ev(700, 1, "exit", outcome="REQUEUED", code=3, step=400),  # a preemption: stopped and saved, no failure
        ev(800, 2, "init"), ev(810, 2, "resume", step=400),  # the current run
    ]
    assert History.of(events[-2:], current=(2, 0)) == History()  # a fresh experiment: only the current run
    history = History.of(events, current=(2, 0))
    assert history.failures == 2 and history.shared_failures == 1  # the hang was served locally, the loss was not
    assert history.exposure_s == pytest.approx(100 + 190 + 300)
    # the prior: one failure in node_h node-hours over the nodes, then one failure per observed one
    assert History().mtbf_s(node_h=1000, nodes=4) == pytest.approx(1000 * 3600 / 4)
    # from its first failure the job's own rate wins where it is shorter: 1 in 590 s, against 900,000 s
    one = History(exposure_s=590, failures=1)
    assert one.mtbf_s(node_h=1000, nodes=4) == pytest.approx(590)
    assert History(exposure_s=9e9, failures=1).mtbf_s(node_h=1000, nodes=4) == pytest.approx((900_000 + 9e9) / 2)
    assert history.mtbf_s(node_h=1000, nodes=4) == pytest.approx(590 / 2)
    assert History(exposure_s=9e9, failures=2).mtbf_s(node_h=1000, nodes=4) == pytest.approx((900_000 + 9e9) / 3)
    # time run without a failure is evidence too
    assert history.lasting(410).mtbf_s(node_h=1000, nodes=4) == pytest.approx(1000 / 2)
    assert history.lasting(-5) == history
    assert history.shared_share() == pytest.approx(1.5 / 3)


def test_the_failure_before_the_current_run_counts_as_served_by_the_tier_the_current_run_resumed_from() -> None:
    # A run lost to a node (killed: no exit), then the current run: the history leaves the current run's time out,
    # but the tier it resumed from is what says whether the local tier served that failure.
    lost = [ev(0, 0, "init"), ev(5, 0, "fresh_start"), ev(60, 0, "progress", step=150)]
    for tier, shared in (("local", 0), ("shared", 1), (None, 1)):
        current = [ev(80, 1, "init"), ev(82, 1, "resume", step=140, **({"tier": tier} if tier else {}))]
        history = History.of(lost + current, current=(1, 0))
        assert (history.failures, history.shared_failures) == (1, shared), tier
        assert history.exposure_s == pytest.approx(60)
    # the current run read the shared tier's newer checkpoint, but the local tier held one whole: the local tier
    # could serve the failure (what a tier's interval needs), whichever tier was newer
    for held, shared in ((130, 0), (None, 1), (True, 1), ("130", 1)):
        current = [ev(80, 1, "init"), ev(82, 1, "resume", step=140, tier="shared", from_peers=0, local_held=held)]
        assert History.of(lost + current, current=(1, 0)).shared_failures == shared, held
    # the current run not started yet (no resume said): not served by the local tier, as before
    assert History.of(lost, current=(1, 0)).shared_failures == 1


def test_with_a_local_tier_local_saves_come_more_often_than_shared_ones() -> None:
    plan = intervals(History(), shared_cost_s=30.0, local_cost_s=2.0, node_h=5000, nodes=128)
    assert plan.local_s is not None and plan.local_s < plan.shared_s / 3
    assert intervals(History(), shared_cost_s=30.0, local_cost_s=None, node_h=5000, nodes=128).local_s is None
    # a local save as slow as the shared one is pointless: shared saves only, the early insurance (test below)
    # through the shared tier too
    dear = intervals(History(), shared_cost_s=5.0, local_cost_s=50.0, node_h=5000, nodes=128)
    assert dear.local_s is None and dear.shared_s == pytest.approx(5.0 / MOST_OVERHEAD)


def test_a_cheap_local_save_comes_at_least_as_often_as_its_overhead_allows() -> None:
    # a 2-node job under the default prior (9,000,000 s between failures): Daly alone would save locally every
    # ~5,000 s for a 1 s stall. Until its first failure the local interval is at most Daly's for one failure in the
    # time trained so far (a run that lasted t says failures come about every t), its overhead from 10 % to 1 %
    plan = intervals(History(), shared_cost_s=2.0, local_cost_s=1.0, node_h=5000, nodes=2)
    assert daly(1.0, 9e6 / 0.5) > 5000
    assert plan.local_s == pytest.approx(1.0 / MOST_OVERHEAD) and plan.shared_s > 3000
    for trained in (60.0, 200.0, 1000.0, 4000.0):  # the interval grows as the square root of the time trained
        during = intervals(History(exposure_s=trained), shared_cost_s=2.0, local_cost_s=1.0, node_h=5000, nodes=2)
        assert during.local_s == pytest.approx(daly(1.0, trained)) == pytest.approx(insured(1.0, trained))
        assert 1.0 / MOST_OVERHEAD < during.local_s < 1.0 / LOCAL_OVERHEAD
    assert insured(1.0, 200.0) == pytest.approx(math.sqrt(2 * 200.0), rel=0.1)  # Young's, to first order
    later = intervals(History(exposure_s=6000), shared_cost_s=2.0, local_cost_s=1.0, node_h=5000, nodes=2)
    assert later.local_s == pytest.approx(1.0 / LOCAL_OVERHEAD) and MOST_OVERHEAD > LOCAL_OVERHEAD
    # a save that stalls more than the time trained (a first save, a slow tier): the most overhead, not an interval
    # shorter than the save
    assert insured(30.0, 5.0) == pytest.approx(30.0 / MOST_OVERHEAD) and insured(0.0, 0.0) > 0
    # from the job's first failure its own rate speaks: no floor, Daly's interval for that rate
    failed = History(exposure_s=9e6, failures=1)
    plan = intervals(failed, shared_cost_s=2.0, local_cost_s=1.0, node_h=5000, nodes=2)
    assert plan.local_s == pytest.approx(daly(1.0, 9e6 / (1 - failed.shared_share()))) and plan.local_s > 3000
    # where the failure rate asks for more, Daly's interval is the shorter and wins
    flaky = History(exposure_s=600, failures=6)
    plan = intervals(flaky, shared_cost_s=2.0, local_cost_s=1.0, node_h=5000, nodes=2)
    share = flaky.shared_share()  # the local tier serves 1 - share of the failures, one every 100 s
    assert plan.local_s == pytest.approx(daly(1.0, 100 / (1 - share))) and plan.local_s < 1.0 / LOCAL_OVERHEAD / 5


def test_the_two_intervals_are_chosen_together_a_shared_save_paying_only_its_difference() -> None:
    # Either tier's save resets the work a failure the local tier serves would lose; a shared save in place of a
    # local one costs the difference in stall, and buys the failures the local tier does not serve.
    history = History(exposure_s=3600, failures=6, shared_failures=2)
    mtbf, share = history.mtbf_s(node_h=5000, nodes=2), history.shared_share()
    plan = intervals(history, shared_cost_s=3.0, local_cost_s=1.0, node_h=5000, nodes=2)
    assert plan.shared_s == pytest.approx(daly(2.0, mtbf / share))
    assert plan.local_s == pytest.approx(daly(1.0, mtbf / (1 - share)))
    # a shared save that stalls no more than a local one: shared saves alone, at Daly's interval for every failure,
    # whatever share the local tier served (its saves would cost as much and serve less)
    for served in (0, 3, 6):
        cheap = intervals(replace(history, shared_failures=served), shared_cost_s=0.06, local_cost_s=0.12,
                          node_h=5000, nodes=2)
        assert cheap == Intervals(daly(0.06, mtbf)), served
    # a local interval no shorter than the shared one: shared saves alone, timed for every failure (not only the
    # share the local tier leaves: that would leave the rest at risk for longer)
    rare_local = intervals(replace(history, shared_failures=6), shared_cost_s=1.2, local_cost_s=1.0, node_h=5000,
                           nodes=2)
    assert rare_local == Intervals(daly(1.2, mtbf)) and daly(1.2, mtbf) < daly(1.2, mtbf / history.shared_share())


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(_clock, "mono", lambda: self.now)


def uninsured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The insurance before the job's first failure aside (its own tests below): the prior's Daly interval alone."""
    from slurmrt.checkpoint import cadence as module

    monkeypatch.setattr(module, "MOST_OVERHEAD", 1e-12)
    monkeypatch.setattr(module, "LOCAL_OVERHEAD", 1e-12)


def cadence(rank: int = 0, comm: Any = None, *, events: Path | None = None, local: bool = False,
            step_s: float = 1.0, node_h: float = 5000.0, nodes: int = 4) -> Cadence:
    return Cadence(rank=rank, comm=lambda: comm or SoloComm(), events=events, current=(0, 0), nodes=nodes,
                   node_h=node_h, local=local, step_s=lambda: step_s)


def train(c: Cadence, clock: Clock, steps: int, *, stall: dict[str, float], start: int = 0) -> list[tuple[int, str]]:
    """Steps of 1 s; each save the cadence asks for stalls ``stall[tier]`` seconds. The saves made, in order."""
    saves = []
    for step in range(start, start + steps):
        clock.now += 1.0
        tier = c.due(step)
        if tier is not None:
            clock.now += stall[tier]
            c.saved(tier, stall[tier])
            saves.append((step, tier))
    return saves


def test_the_first_save_comes_early_to_measure_it_then_the_interval_is_dalys(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    clock = Clock(monkeypatch)
    uninsured(monkeypatch)
    c = cadence(node_h=50.0, nodes=4)  # M = 45,000 s
    saves = train(c, clock, 2000, stall={"shared": 10.0})
    assert saves[0] == (WARMUP_STEPS, "shared")  # nothing measured: one save to measure it
    gaps = [b - a for (a, _), (b, _) in zip(saves[1:], saves[2:], strict=False)]
    # 1 s steps: seconds of training are steps; the prior's M grows by the time the run has lasted
    low, high = daly(10.0, 45_000.0), daly(10.0, 45_000.0 + clock.now - 1000.0)
    assert gaps and all(low - 2 <= g <= high + 2 for g in gaps), (gaps, low, high)


def test_the_interval_adapts_when_the_save_cost_and_the_failure_rate_change(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    clock = Clock(monkeypatch)
    uninsured(monkeypatch)
    c = cadence(node_h=50.0, nodes=4)
    cheap = train(c, clock, 3000, stall={"shared": 5.0})
    dear = train(c, clock, 6000, stall={"shared": 20.0}, start=3000)
    gap = lambda saves: saves[-1][0] - saves[-2][0]  # noqa: E731
    assert gap(dear) / gap(cheap) == pytest.approx(math.sqrt(4), rel=0.1)  # four times the stall: twice the gap
    # a history of frequent failures (10 in 2,000 s) makes saves more frequent than the prior alone
    log = tmp_path / "events.jsonl"
    events = [e for n in range(1, 11) for e in (ev(n * 200, n, "init"), ev(n * 200 + 200, n, "exit", outcome="HUNG"))]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    clock2 = Clock(monkeypatch)
    flaky = cadence(node_h=50.0, nodes=4, events=log)
    flaky.saved("shared", 5.0)  # measured: no warm-up save
    saves = train(flaky, clock2, 3000, stall={"shared": 5.0})
    # its own rate (2,000 s over 10 failures, and this run's time as it lasts) wins over the prior's 45,000 s
    low, high = daly(5.0, 2000 / 10), daly(5.0, (2000 + clock2.now - 1000.0) / 10)
    assert low - 2 <= gap(saves) <= high + 2 and gap(saves) < gap(cheap) / 2


def test_the_stall_is_the_mean_of_the_last_three_saves_so_one_slow_save_does_not_stretch_the_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    Clock(monkeypatch)  # the clock stands still: the prior's M is 45,000 s throughout
    uninsured(monkeypatch)
    c = cadence(node_h=50.0, nodes=4)
    for stall in (5.0, 5.0, 20.0):  # one slow save (a busy filesystem) after two usual ones
        c.saved("shared", stall)
    assert c.due(0) is None  # the first call starts the clock
    c.due(WARMUP_STEPS)
    assert c.plan is not None and c.plan.shared_s == pytest.approx(daly(10.0, 45_000.0))  # not daly(20, M)
    for stall in (5.0, 5.0, 5.0):  # the slow one has left the last three
        c.saved("shared", stall)
    step = WARMUP_STEPS
    while c.plan.shared_s != pytest.approx(daly(5.0, 45_000.0)) and step < 5000:
        step += 1
        c.due(step)
    assert c.plan.shared_s == pytest.approx(daly(5.0, 45_000.0))


def test_with_a_local_tier_it_answers_local_between_shared_saves(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    c = cadence(local=True, node_h=20.0, nodes=8)
    saves = train(c, clock, 4000, stall={"shared": 30.0, "local": 1.0})
    assert [t for _, t in saves[:2]] == ["shared", "local"]  # each measured once, early
    tiers = [t for _, t in saves[2:]]
    assert tiers.count("local") > 3 * tiers.count("shared") > 0
    plan = c.plan
    assert plan is not None and plan.local_s is not None
    local_gaps = [b - a for (a, x), (b, y) in zip(saves[2:], saves[3:], strict=False) if x == y == "local"]
    assert local_gaps and max(local_gaps) <= plan.local_s + 2


class Pair:
    """Two ranks' broadcast: rank 0 calls first at each check step, rank 1 gets what it sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.calls = [0, 0]

    def comm(self, rank: int) -> Any:
        pair = self

        class One:
            world_size = 2

            def broadcast(self, obj: Any) -> Any:
                pair.calls[rank] += 1
                if rank == 0:
                    pair.sent.append(obj)
                    return obj
                return pair.sent[pair.calls[1] - 1]

        One.rank = rank  # type: ignore[attr-defined]
        return One()


def test_every_rank_gets_rank_0s_answer_at_the_same_step_with_one_exchange_per_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    pair = Pair()
    ranks = [cadence(0, pair.comm(0), node_h=10.0, nodes=2), cadence(1, pair.comm(1), step_s=7.0)]
    answers: list[list[str | None]] = [[], []]
    for step in range(3000):
        clock.now += 1.0
        for rank, c in enumerate(ranks):
            answers[rank].append(c.due(step))
            if answers[rank][-1]:
                c.saved("shared", 3.0 if rank == 0 else 50.0)  # rank 1's own figures play no part
    assert answers[0] == answers[1] and sum(a is not None for a in answers[0]) > 5
    assert pair.calls[0] == pair.calls[1] < 3000 / 10  # exchanges at check steps only


def test_after_an_in_process_restart_every_rank_asks_at_the_same_step_and_the_fault_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    uninsured(monkeypatch)  # the prior's interval before the fault, the job's own rate after it
    pair = Pair()
    ranks = [cadence(0, pair.comm(0), node_h=10.0, nodes=2), cadence(1, pair.comm(1))]

    def run(rank: int, steps: range) -> list[tuple[int, str | None]]:
        return [(step, ranks[rank].due(step)) for step in steps]

    for step in range(40):  # both ranks, in step
        clock.now += 1.0
        for c in ranks:
            if c.due(step):
                c.saved("shared", 1.0)
    run(0, range(40, 48))  # rank 0 asked up to step 47; rank 1 raised after step 46's update, before asking
    run(1, range(40, 47))
    before = ranks[0].plan
    for c in ranks:
        c.restart()
    pair.sent.clear()  # the restart's new work group: what rank 0 sent at step 47 alone went with the old one
    pair.calls = [0, 0]
    answers: list[list[tuple[int, str | None]]] = [[], []]
    for step in range(45, 400):  # both go on from the same checkpoint (step 44)
        clock.now += 1.0
        for rank, c in enumerate(ranks):
            answers[rank].append((step, c.due(step)))
            if answers[rank][-1][1]:
                c.saved("shared", 1.0)
    assert answers[0] == answers[1] and pair.calls[0] == pair.calls[1]
    assert any(tier for _, tier in answers[0])
    # the fault is a failure of this run: its own rate (one in about 50 s) is shorter than the prior's 18,000 s
    assert before is not None and ranks[0].plan is not None and ranks[0].plan.shared_s < before.shared_s / 5


def test_a_check_joins_the_background_save_before_its_broadcast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A background save's commit runs collectives on the work group from its own thread: a check's broadcast on
    the same group must wait for it, or the two would pair up differently on different ranks."""
    clock = Clock(monkeypatch)
    order: list[str] = []

    class Logged(SoloComm):
        def broadcast(self, obj: Any) -> Any:
            order.append("broadcast")
            return obj

    c = Cadence(rank=0, comm=Logged, events=None, current=(0, 0), nodes=2, node_h=10.0, local=False,
                step_s=lambda: 1.0, join=lambda: order.append("join"))
    saves = train(c, clock, 50, stall={"shared": 1.0})
    assert saves and len(order) >= 4 and order == ["join", "broadcast"] * (len(order) // 2)


def test_status_says_what_should_save_would_answer_for_a_jobs_measurements() -> None:
    from slurmrt.checkpoint.advice import advice

    events = [ev(0, 0, "init", nnodes=4), ev(1, 0, "fresh_start"), ev(50, 0, "progress", step=100, step_s=0.5),
              ev(60, 0, "save", step=119, seconds=8.0, blocking=True), ev(100, 0, "exit", outcome="HUNG", code=5),
              ev(110, 1, "init", nnodes=4), ev(120, 1, "resume", step=119),
              ev(200, 1, "save", step=300, seconds=12.0, blocking=True),
              ev(300, 1, "exit", outcome="FINISHED", code=0)]
    head, said = advice(events, node_h=0.1)
    mtbf = (3600 * 0.1 / 4 + 100 + 190) / 2  # the prior's 90 s and the runs' 290 s, over the prior and the hang
    assert head.startswith("saving: saves of 10 s; a failure every 3m10s (1 in 4m50s, and a prior of 1 in 0.1 "
                           "node-hours over 4 node(s))"), head
    expected = daly(10.0, mtbf)
    assert f"about {round(expected / 0.5)} steps" in said, (said, expected)
    assert advice([e for e in events if e["event"] != "save"], node_h=0.1) == []  # no save measured: nothing said
    # a prior of 900 s: the job's own rate (290 s over its one failure) is shorter, and the one used, and said
    head, _ = advice(events, node_h=1.0)
    assert "a failure every 4m50s (1 in 4m50s, its own rate, shorter than a prior of 1 in 1 node-hours" in head, head
    again = [*events[:-1], ev(300, 1, "exit", outcome="HUNG", code=5)]
    head, _ = advice(again, node_h=1.0)
    assert "a failure every 2m25s (2 in 4m50s, its own rate, shorter than a prior of 1 in 1 node-hours" in head, head
    from slurmrt.checkpoint.advice import saving

    figures = [saving(e, node_h=h) for e, h in ((again, 1.0), (events, 1.0), (events, 0.1))]
    assert [f["own_rate"] if f else None for f in figures] == [True, True, False]


def test_status_json_carries_the_figures_the_words_are_made_of(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from slurmrt.cli import main

    events = [ev(0, 0, "init", nnodes=4), ev(1, 0, "fresh_start"), ev(50, 0, "progress", step=100, step_s=0.5),
              ev(60, 0, "save", step=119, seconds=8.0, blocking=True), ev(100, 0, "exit", outcome="HUNG", code=5),
              ev(110, 1, "init", nnodes=4), ev(120, 1, "resume", step=119),
              ev(200, 1, "save", step=300, seconds=12.0, blocking=True),
              ev(300, 1, "exit", outcome="FINISHED", code=0)]
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("SLURMRT_MTBF_NODE_H", "0.1")
    try:
        assert main(["status", str(tmp_path), "--json"]) == 0
    finally:
        monkeypatch.undo()
    saving = json.loads(capsys.readouterr().out)["jobs"][0]["saving"]
    mtbf = (3600 * 0.1 / 4 + 100 + 190) / 2
    assert saving["shared_save_s"] == pytest.approx(10.0) and saving["local_save_s"] is None
    assert saving["failures"] == 1 and saving["nodes"] == 4 and saving["mtbf_s"] == pytest.approx(mtbf)
    assert saving["shared_every_s"] == pytest.approx(daly(10.0, mtbf))
    assert saving["shared_every_steps"] == round(daly(10.0, mtbf) / 0.5) and saving["local_every_s"] is None


def test_a_local_tier_that_fails_to_save_leaves_the_answers_to_the_shared_tier(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    clock = Clock(monkeypatch)
    c = cadence(local=True, node_h=20.0, nodes=8)
    answers = []
    for step in range(400):
        clock.now += 1.0
        tier = c.due(step)
        if tier is not None:
            answers.append(tier)
            c.saved(tier, 2.0, ok=tier == "shared")  # every local save fails (its directory is missing, say)
    assert answers[:2] == ["shared", "local"] and set(answers[2:]) == {"shared"}, answers  # asked once, no more


def test_a_step_that_starts_at_0_each_epoch_keeps_saving(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A user loop `for step in range(len(loader))` inside `for epoch in ...`: the step goes back to 0 each epoch.
    The saves go on at the same interval as with a step that counts on (they once stopped after the first epoch,
    silently), and rank 0 says once what it does."""
    clock = Clock(monkeypatch)
    counted, per_epoch = cadence(node_h=50.0, nodes=4), cadence(node_h=50.0, nodes=4)
    expected = train(counted, Clock(monkeypatch), 2000, stall={"shared": 10.0})
    monkeypatch.setattr(_clock, "mono", lambda: clock.now)
    saves = []
    with caplog.at_level("INFO", logger="slurmrt.checkpoint.cadence"):
        for epoch in range(10):  # 10 epochs of 200 steps, each much shorter than the save interval
            saves += [(epoch * 200 + s, tier) for s, tier in train(per_epoch, clock, 200, stall={"shared": 10.0})]
    assert len(expected) >= 3 and saves == expected
    assert sum("the step went back from 199 to 0" in r.message for r in caplog.records) == 1


def test_a_resumed_run_saves_nothing_only_to_measure_a_stall_the_log_knows(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    # Every new step of an in-job restart, and every requeued run, saved to the local tier at its second check only
    # to measure a stall its event log already held: the earlier runs' local saves now count, as the shared ones do.
    log = tmp_path / "events-5.jsonl"
    events = EventLog(log, job="5", restart=0, rank=0)
    events.emit(Event.SAVE, step=10, seconds=30.0, stall=30.0, blocking=True)
    events.emit(Event.SAVE, step=12, seconds=1.0, stall=1.0, blocking=True, tier="local")
    earlier = measured_earlier(log)
    assert (earlier.save_s, earlier.stalls) == (30.0, {"shared": [30.0], "local": [1.0]})

    def resumed(stalls: dict[str, list[float]]) -> list[tuple[int, str]]:
        c = Cadence(rank=0, comm=SoloComm, events=None, current=(1, 0), nodes=8, node_h=20.0, local=True,
                    step_s=lambda: 1.0, stalls=stalls)
        return train(c, Clock(monkeypatch), 60, stall={"shared": 30.0, "local": 1.0}, start=13)

    measuring = resumed({})  # the control: nothing known, each tier saved once to measure it
    assert measuring[:2] == [(13 + WARMUP_STEPS, "shared"), (13 + 2 * WARMUP_STEPS, "local")]
    known = resumed(earlier.stalls)
    # the early insurance's interval (1 s / MOST_OVERHEAD) from the run's first call, not a save to measure
    assert known and known[0][1] == "local" and known[0][0] >= 13 + 1.0 / MOST_OVERHEAD - 1, known


def test_a_background_saves_stall_not_its_write_is_what_a_resumed_run_and_status_take_as_its_cost(
        tmp_path: Path) -> None:
    """A background save writes behind the training for seconds after a call that held it a fraction of one: the
    deadline needs the write's time (a stop's save is blocking), ``rt.should_save`` the stall. A resumed run, and
    status's advice, took the write's time as the stall until the run had measured three saves of its own."""
    from slurmrt.checkpoint.advice import saving

    log = tmp_path / "events-5.jsonl"
    events = EventLog(log, job="5", restart=0, rank=0)
    events.emit(Event.INIT, nnodes=2)
    for step, (write, stall) in enumerate(((9.0, 0.5), (12.0, 0.3), (15.0, 0.4), (18.0, 0.1))):
        events.emit(Event.SAVE, step=step, seconds=write, stall=stall, blocking=False)
    events.emit(Event.SAVE, step=9, seconds=2.0, stall=2.5, blocking=True, tier="local")
    events.emit(Event.SAVE, step=10, seconds=3.0, blocking=True, tier="local")  # an older log's: its whole time
    events.emit(Event.SAVE, step=11, seconds=30.0, blocking=False)  # an older log's background save: unknown
    earlier = measured_earlier(log)
    assert earlier.save_s == 30.0  # the deadline's: the longest of the last three writes
    assert earlier.stalls == {"shared": [0.3, 0.4, 0.1], "local": [2.5, 3.0]}
    said = saving([json.loads(line) for line in log.read_text().splitlines()], node_h=1.0)
    assert said is not None
    assert (said["shared_save_s"], said["local_save_s"]) == (pytest.approx(0.8 / 3), pytest.approx(2.75))


def test_before_the_first_failure_the_insurance_goes_through_the_tier_that_insures_for_less() -> None:
    # The goodput benchmark's tiers: a background shared save stalls 5 ms and writes in 80 ms; a blocking local one
    # stalls 100 ms. Insured through the shared tier, at the interval its whole write allows (the filesystem's share
    # of the time bounded as the stall's is): the same work at risk for a twentieth of the stall.
    assert insurer(60.0, shared_cost_s=0.005, shared_write_s=0.08, local_cost_s=0.1) == "shared"
    plan = intervals(History(exposure_s=60.0), shared_cost_s=0.005, local_cost_s=0.1, shared_write_s=0.08,
                     node_h=5000, nodes=2)
    assert plan.local_s is None and plan.shared_s == pytest.approx(insured(0.08, 60.0))
    assert plan.shared_s >= 0.08 / MOST_OVERHEAD  # the filesystem writes for this job 10 % of the time at most
    # The model's tiers at scale: a shared save stages in 4 s but writes for 100 s at 1 GB/s per node; a local one
    # stalls 10 s. Insured through the local tier: the shared tier's insured interval would put far more work at risk.
    assert insurer(3600.0, shared_cost_s=4.0, shared_write_s=100.0, local_cost_s=10.0) == "local"
    plan = intervals(History(exposure_s=3600.0), shared_cost_s=4.0, local_cost_s=10.0, shared_write_s=100.0,
                     node_h=5000, nodes=2)
    assert plan.local_s == pytest.approx(insured(10.0, 3600.0)) and plan.shared_s > plan.local_s
    # without a local tier, the shared one insures: its whole write bounds the interval, else its stall
    alone = intervals(History(exposure_s=3600.0), shared_cost_s=4.0, local_cost_s=None, shared_write_s=60.0,
                      node_h=5000, nodes=2)
    assert alone.local_s is None and alone.shared_s == pytest.approx(insured(60.0, 3600.0))
    assert alone.shared_s == pytest.approx(daly(60.0, 3600.0)) and alone.shared_s < daly(4.0, 9e6) / 5
    unknown = intervals(History(exposure_s=3600.0), shared_cost_s=4.0, local_cost_s=None, node_h=5000, nodes=2)
    assert unknown.shared_s == pytest.approx(insured(4.0, 3600.0))
    # from the first failure the job's own rate speaks, and the insurance ends
    failed = intervals(History(exposure_s=3600.0, failures=1, shared_failures=1), shared_cost_s=4.0,
                       local_cost_s=None, shared_write_s=60.0, node_h=5000, nodes=2)
    assert failed.shared_s == pytest.approx(daly(4.0, 3600.0))


def test_a_jobs_saves_before_its_first_failure_go_to_the_tier_that_insures_for_less(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1 s steps; a shared save stalls 1 s and writes for 10 s (or 200 s, a slow filesystem); a local one stalls
    12 s. Under the default prior, nothing but the insurance calls for a save."""

    def saves(write_s: float) -> list[tuple[int, str]]:
        c = Cadence(rank=0, comm=SoloComm, events=None, current=(0, 0), nodes=2, node_h=5000.0, local=True,
                    step_s=lambda: 1.0, stalls={"shared": [1.0], "local": [12.0]}, writes=lambda: [write_s])
        return train(c, Clock(monkeypatch), 1500, stall={"shared": 1.0, "local": 12.0})

    fast = saves(10.0)
    gaps = [b - a for (a, _), (b, _) in zip(fast, fast[1:], strict=False)]
    assert {tier for _, tier in fast} == {"shared"} and len(fast) > 8
    assert all(10.0 / MOST_OVERHEAD - 2 <= g <= insured(10.0, 1600.0) + 2 for g in gaps), gaps
    slow = saves(200.0)
    assert {tier for _, tier in slow} == {"local"} and len(slow) > 8
