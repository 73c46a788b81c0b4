"""The goodput benchmark's model at scale (benchmarks/bench_goodput.py), checked against a hand computation: the
figures RESULTS.md quotes come from it, so it is tested like the code (issue 52)."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_goodput as bench


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
    monkeypatch.setattr(bench, "run", lambda **_: pytest.fail("--help started the benchmark"))
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0 and "--model" in capsys.readouterr().out
    bench.main(["--model"])
    assert "| at 16,384 GPUs, if | 1 | 1* | 2 | 3 | 4 |" in capsys.readouterr().out


def test_every_input_of_the_model_says_where_it_comes_from() -> None:
    assert set(bench.SOURCES) == set(bench.INPUTS)
    assert all(source.startswith(("measured", "assumed", "Llama 3", "the fixed")) for source in bench.SOURCES.values())
