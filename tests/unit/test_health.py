"""One rank's judgement of a step (slurmrt.health.window): non-finite values always, a spike only against enough
recent healthy losses, never a falling loss; the settings are options like any other."""

from __future__ import annotations

import math
import random

import pytest

from slurmrt._errors import ConfigError
from slurmrt.health.settings import HealthSection
from slurmrt.health.window import MIN_HISTORY, LossWindow
from slurmrt.options import Options


def _window(**settings: float) -> LossWindow:
    return LossWindow(HealthSection(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(("loss", "norm", "why"), [(math.nan, None, "loss is nan"), (math.inf, 1.0, "loss is inf"),
                                                   (1.0, math.nan, "grad_norm is nan"),
                                                   (1.0, -math.inf, "grad_norm is -inf")])
def test_a_value_that_is_not_finite_is_unhealthy_from_the_first_step(loss: float, norm: float | None,
                                                                       why: str) -> None:
    verdict = _window().judge(loss, norm)
    assert verdict is not None and verdict.what == "nonfinite" and verdict.why == why


def test_a_spike_is_judged_only_against_enough_healthy_losses_and_never_joins_them() -> None:
    w = _window()
    for _ in range(MIN_HISTORY - 1):
        assert w.judge(2.0) is None
    assert w.judge(50.0) is None  # 19 held: too few to judge a spike; it joins them
    w = _window()
    for i in range(MIN_HISTORY):
        assert w.judge(2.0 + 0.01 * (i % 3)) is None
    verdict = w.judge(6.0)
    assert verdict is not None and verdict.what == "spike" and "median of the last 20 healthy losses" in verdict.why
    assert len(w.losses) == MIN_HISTORY and max(w.losses) < 3  # the spike stayed out
    assert w.judge(2.02) is None and w.judge(2.9) is None  # 45 % above the median: under the margin


def test_a_falling_loss_is_never_a_spike_however_fast_it_falls() -> None:
    w = _window()
    assert all(w.judge(10.0 * 0.9 ** i) is None for i in range(200))


@pytest.mark.parametrize("seed", range(20))
def test_no_healthy_curve_fires(seed: int) -> None:
    """A loss that decays with noise of its own size (5 %), plateaus and steps down at a learning-rate drop: 3,000
    steps of each of 20 seeds, no verdict (the campaign's false-positive half, on the detector alone)."""
    rng = random.Random(seed)
    w = _window()
    for step in range(3000):
        base = 0.5 + 4.0 * math.exp(-step / 400) - (0.2 if step > 2000 else 0.0)
        assert w.judge(base * (1 + 0.05 * rng.gauss(0, 1)), abs(rng.gauss(1.0, 0.3))) is None, step


def test_the_window_keeps_its_size() -> None:
    w = _window(health_window=30)
    for i in range(100):
        w.judge(1.0 + 0.001 * i)
    assert len(w.losses) == 30


def test_the_health_settings_are_options_with_rules() -> None:
    assert HealthSection.of(Options.resolve({"spike_sigmas": 6}, {"SLURMRT_HEALTH_WINDOW": "200"})) == HealthSection(
        health_window=200, spike_sigmas=6.0)
    with pytest.raises(ConfigError, match="health_window"):
        Options.resolve({}, {"SLURMRT_HEALTH_WINDOW": "5"})
    with pytest.raises(ConfigError, match="spike_margin"):
        Options.resolve({"spike_margin": math.nan}, {})


def test_a_rehearsed_nan_comes_once_or_every_time_as_slurmrt_sim_says() -> None:
    from slurmrt._errors import TrainingHealthError
    from slurmrt.health.check import HealthCheck, rehearsal
    from slurmrt.record.events import EventLog

    assert rehearsal("5") == (5, False) and rehearsal("5:every") == (5, True)
    assert rehearsal(None) is None and rehearsal("") is None and rehearsal("five") is None and rehearsal("5:x") is None
    for every, again in ((False, False), (True, True)):
        check = HealthCheck(HealthSection(), EventLog(None, job=None, restart=0, rank=0), rank=0, world_size=1,
                            rehearse=(5, every))
        check.check(4, loss=1.0)
        with pytest.raises(TrainingHealthError, match="step 5: rank 0's training is unhealthy") as caught:
            check.check(5, loss=1.0)
        assert caught.value.details == {"step": 5, "rank": 0, "what": "nonfinite", "action": "rerun", "refused": None}
        if again:
            with pytest.raises(TrainingHealthError):
                check.check(5, loss=1.0)  # a bad batch: the rewound run meets it again
        else:
            check.check(5, loss=1.0)  # a transient fault: the rewound run passes


@pytest.mark.parametrize("value", ["1.5", True, b"1", [1.0, 2.0], object()])
def test_a_value_that_is_not_a_number_is_a_clear_error(value: object) -> None:
    from slurmrt.health.check import HealthCheck
    from slurmrt.record.events import EventLog

    check = HealthCheck(HealthSection(), EventLog(None, job=None, restart=0, rank=0), rank=0, world_size=1)
    with pytest.raises(ConfigError, match="loss and grad_norm are numbers or one-element tensors"):
        check.check(3, loss=value)
    with pytest.raises(ConfigError, match="loss and grad_norm"):
        check.check(3, loss=1.0, grad_norm=value)


def test_several_processes_without_a_process_group_are_refused_rather_than_each_deciding_alone() -> None:
    from slurmrt.health.check import HealthCheck
    from slurmrt.record.events import EventLog

    check = HealthCheck(HealthSection(), EventLog(None, job=None, restart=0, rank=1), rank=1, world_size=2)
    with pytest.raises(ConfigError, match="init_process_group"):
        check.check(0, loss=1.0)
