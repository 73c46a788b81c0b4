"""The goodput benchmark's model at scale (benchmarks/bench_goodput.py), checked against a hand computation: the
figures RESULTS.md quotes come from it, so it is tested like the code (issue 52)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_goodput
from benchmarks import goodput_model as bench


def test_policy_1_at_16k_gpus_is_the_hand_computation() -> None:
    mtbf = 54 * 24 / 466 * 3600  # Llama 3: 466 interruptions in 54 days at 16,384 GPUs
    node_gb = 0.35 * 8
    stall = node_gb / 25 / 1800  # a background save staged at 25 GB/s, every 30 minutes
    per_failure = 5.5 + (3 + 300) + node_gb / 1 + 1800 / 2  # detect, requeue, load, half an interval lost
    got = bench.model(bench.Scale(16_384, spares=16), bench.POLICIES[0])
    assert got["per_failure_s"] == pytest.approx(per_failure)
    assert got["ettr"] == pytest.approx(1 - stall - per_failure / mtbf)
    assert got["node_goodput"] == pytest.approx(got["ettr"])  # no spare held


def test_policy_1_with_young_daly_saves_at_its_own_optimum() -> None:
    mtbf = 54 * 24 / 466 * 3600
    cost = 0.35 * 8 / 25
    young = math.sqrt(2 * cost * mtbf)
    got = bench.model(bench.Scale(16_384, spares=16), bench.BASELINE)
    assert got["t_shared_s"] == pytest.approx(young, rel=0.01) and got["requeued"] == 1.0
    assert got["ettr"] == pytest.approx(1 - cost / got["t_shared_s"]
                                        - (5.5 + 303 + 2.8 + got["t_shared_s"] / 2) / mtbf)


def test_policy_4_times_its_saves_as_should_save_does_both_tiers_together() -> None:
    from slurmrt.checkpoint.cadence import daly

    mtbf = 54 * 24 / 466 * 3600
    node_gb = 0.35 * 8
    # a background shared save (staged at 25 GB/s) stalls less than a blocking local one (10 GB/s): shared alone,
    # Daly's interval for every failure; each failure loses half of it and loads from the shared tier (1 GB/s)
    got = bench.model(bench.Scale(16_384, spares=16), bench.POLICIES[3])
    assert got["t_shared_s"] == pytest.approx(daly(node_gb / 25, mtbf)) and math.isnan(got["t_local_s"])
    requeued = bench.requeued_share(bench.Scale(16_384, spares=16), bench.POLICIES[3], bench.INPUTS)
    restart = (1 - requeued) * 3 + requeued * 303
    assert got["per_failure_s"] == pytest.approx(5.5 + restart + node_gb / 1 + got["t_shared_s"] / 2)
    # a slow shared save (0.2 GB/s): both tiers, the shared one paying only its stall above the local one's
    slow = {**bench.INPUTS, "shared_gbps_per_node": 0.2, "staging_gbps_per_node": 0.2}
    got = bench.model(bench.Scale(16_384, spares=16), bench.POLICIES[3], slow)
    shared_c, local_c = node_gb / 0.2, node_gb / 10
    assert got["t_shared_s"] == pytest.approx(daly(shared_c - local_c, mtbf / 0.1))
    assert got["t_local_s"] == pytest.approx(daly(local_c, mtbf / 0.9))
    assert got["stall"] == pytest.approx(shared_c / got["t_shared_s"] + local_c / got["t_local_s"]
                                         - local_c / got["t_shared_s"])


def test_spares_requeue_one_failure_in_s_plus_1_and_lost_first_nodes() -> None:
    scale = bench.Scale(16_384, spares=16)
    share = bench.requeued_share(scale, bench.POLICIES[1], bench.INPUTS)
    first = 0.6 / 2048
    assert share == pytest.approx(first + (1 - first) / 17)


def test_every_sensitivity_row_is_finite_and_a_local_tier_that_serves_nothing_costs_nothing() -> None:
    rows = dict(bench.sensitivity_rows())
    assert all(0.0 < e < 1.0 for figures in rows.values() for e in figures.values()), rows
    four = bench.POLICIES[-1].name
    assert rows["failures 4x as frequent"][four] < rows["as above"][four] < rows["failures 4x as rare"][four]
    assert rows["every restart takes 10 minutes"][four] < rows["as above"][four]


def test_help_prints_help_and_starts_nothing(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_goodput, "run", lambda *_, **__: pytest.fail("--help started the benchmark"))
    with pytest.raises(SystemExit) as done:
        bench_goodput.main(["--help"])
    assert done.value.code == 0 and "--seeds" in capsys.readouterr().out
    bench_goodput.main(["--model"])
    assert "| at 16,384 GPUs, if | 1 | 1* | 2 | 3 | 4 |" in capsys.readouterr().out


def test_every_input_of_the_model_says_where_it_comes_from() -> None:
    assert set(bench.SOURCES) == set(bench.INPUTS)
    assert all(source.startswith(("measured", "assumed", "Llama 3", "the fixed")) for source in bench.SOURCES.values())


def test_each_seed_draws_faults_on_the_training_clock_that_land_while_steps_remain() -> None:
    for seed in range(41, 46):
        faults = bench_goodput.faults_for(seed, 1200)
        assert faults == bench_goodput.faults_for(seed, 1200)  # the same for every policy
        steps = [f.at_step for f in faults]
        assert steps and all(s is not None and 1 <= s <= 1080 for s in steps)
        assert all(b - a >= bench_goodput.MIN_GAP for a, b in zip(steps, steps[1:], strict=False))
    assert bench_goodput.faults_for(41, 1200) != bench_goodput.faults_for(42, 1200)


def test_the_conclusion_is_the_medians_and_says_when_the_policies_met_different_faults() -> None:
    names = [p.name for p in bench_goodput.POLICIES]
    ettr = {names[0]: [0.5, 0.6, 0.4], names[1]: [0.6, 0.5, 0.7], names[2]: [0.55, 0.6, 0.45],
            names[3]: [0.52, 0.7, 0.41]}
    diffs = {n: [a - b for a, b in zip(ettr[n], ettr[names[0]], strict=True)] for n in names[1:]}
    results = {s: {n: {"met": 3} for n in names} for s in (1, 2, 3)}
    said = bench_goodput._conclusion(ettr, diffs, results, {1: 3, 2: 3, 3: 3})
    # policy 2: differences +10, -10, +30: the median +10, not the mean +10 by chance (policy 4: +2, +10, +1)
    assert "Policy 2 against policy 1: median +10.0 points (range -10.0 to +30.0; above policy 1 in 2 of 3" in said
    assert "Policy 4 against policy 1: median +2.0 points" in said
    assert "policy 2 keeps the most" in said and "the same faults in every seed" in said
    results[2][names[3]]["met"] = 2
    said = bench_goodput._conclusion(ettr, diffs, results, {1: 3, 2: 3, 3: 3})
    assert "different numbers of faults in seed(s) 2" in said and "1 drawn fault(s) never came" in said


def test_faults_answered_in_the_job_are_counted_against_those_the_job_could_answer() -> None:
    """A preemption and the loss of the batch script's node (the first node of the run it hit: n1, then n2 after a
    requeue that left n1 out) go through the queue by design; every other fault the job could answer itself."""
    def init(time: str, nodes: list[str], **more: object) -> dict[str, object]:
        return {"event": "init", "time": f"2026-11-27T10:00:{time}+00:00", "nodelist": nodes, **more}

    events = [init("00.000", ["n1", "n2"]), {"event": "in_job_restart", "time": "2026-11-27T10:00:05.000+00:00"},
              init("06.000", ["n1", "n3"], attempt=1), init("20.000", ["n2", "n3"])]
    sim_out = "\n".join([
        "faults (trace t.csv): 5 injected (2 node-loss, 1 rank-crash, 1 hang, 1 preemption)",
        "  2026-11-27T10:00:04.000 rank-crash: task 1",   # the job could answer it, and did
        "  2026-11-27T10:00:10.000 node-loss: n1",        # the batch node of the first run: the queue's
        "  2026-11-27T10:00:25.000 preemption: the job",  # the cluster's
        "  2026-11-27T10:00:30.000 node-loss: n1",        # n1 is not this run's batch node (n2 is): could, did not
        "  2026-11-27T10:00:40.000 hang: task 0",         # could, did not
        "slurmrt sim: 3 runs"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "UTC")
        import time
        time.tzset()
        try:
            assert bench_goodput.in_job(sim_out, events) == (1, 3)
            assert bench_goodput._share([{"in_job": (1, 3)}, {"in_job": (2, 3)}]) == "3/6 (50%)"
            assert bench_goodput._share([{"in_job": (0, 0)}]) == "0/0"
        finally:
            mp.undo()
            time.tzset()
