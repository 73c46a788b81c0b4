"""The in-process restart's decision: the recovery plan's (Trigger.RAISED), pure, the same on every rank; and the
wrapper's own checks (runtime/inprocess.py)."""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace

import pytest

from slurmrt._errors import ConfigError
from slurmrt._text import shorten
from slurmrt.recovery.facts import Facts, InProcessFacts, Raised
from slurmrt.recovery.plan import Action, Decision, Trigger, plan
from slurmrt.recovery.policy import Outcome
from slurmrt.runtime.inprocess import Fault, InProcess
from slurmrt.stop.decision import Reason, StopDecision


def _fault(kind: str = "RuntimeError", step: int | None = 7, rank: int = 1) -> Fault:
    return Fault(rank, f"{kind}: boom", kind, step, 1.0e9)


def _plan(fault: Fault, restarted: list[Fault] = (), most: int = 3,  # type: ignore[assignment]
          stop: StopDecision | None = None) -> Decision:
    facts = Facts(in_process=InProcessFacts(most, tuple(f.raised for f in restarted)))
    return plan(Trigger.RAISED, facts, raised=fault.raised, stop=stop)


def refused(fault: Fault, restarted: list[Fault] = (), most: int = 3,  # type: ignore[assignment]
            stop: StopDecision | None = None) -> str | None:
    decision = _plan(fault, restarted, most, stop)
    assert (decision.action is Action.IN_PROCESS_RESTART) == (decision.in_process_refused is None)
    return decision.in_process_refused


def test_a_first_fault_is_restarted_in_the_process_and_carries_the_decision_without_it() -> None:
    decision = _plan(_fault())
    assert decision.action is Action.IN_PROCESS_RESTART and decision.restarts
    assert decision.why == "restart 1 in the process"
    assert decision.fallback is not None and decision.fallback.action is Action.FAIL
    assert _plan(_fault(step=8), [_fault()]).why == "restart 2 in the process"


def test_a_refused_restart_is_what_the_plan_says_for_a_software_error() -> None:
    decision = _plan(_fault(), [_fault()])
    assert decision.action is Action.FAIL and decision.outcome is Outcome.FAILED
    assert dataclasses.replace(decision, in_process_refused=None) == plan(Trigger.SOFTWARE_ERROR, Facts())


def test_no_restart_in_the_process_outside_run_restartable() -> None:
    decision = plan(Trigger.RAISED, Facts(), raised=Raised("RuntimeError", 3))
    assert decision.action is Action.FAIL and "run_restartable" in str(decision.in_process_refused)


def test_the_same_error_at_the_same_step_is_not_restarted_twice_whichever_rank_raised_it() -> None:
    why = refused(_fault(rank=2), [_fault(rank=1)])
    assert why is not None and "repeats" in why and "step 7" in why


def test_another_error_or_another_step_is_restarted_again() -> None:
    assert refused(_fault("ValueError"), [_fault()]) is None
    assert refused(_fault(step=8), [_fault()]) is None


def test_max_in_process_restarts_bounds_the_restarts() -> None:
    earlier = [_fault(step=s) for s in (1, 2)]
    assert refused(_fault(step=3), earlier[:1], most=2) is None
    why = refused(_fault(step=3), earlier, most=2)
    assert why is not None and "max_in_process_restarts=2" in why
    assert refused(_fault(), most=0) is not None


def test_a_misconfiguration_is_not_restarted_every_generation_would_meet_it() -> None:
    fault = Fault(1, "ConfigError: save(..., tier='local') needs a node-local directory", "ConfigError", 7, 1.0e9,
                  misconfigured=True)
    why = refused(Fault.from_json(fault.to_json()))
    assert why is not None and "misconfiguration (ConfigError)" in why


def test_an_error_after_an_agreed_stop_ends_the_run_as_it_would_have() -> None:
    why = refused(_fault(), stop=StopDecision(7, frozenset({Reason.TERM}), True))
    assert why is not None and "stop" in why


def test_a_fault_before_the_first_step_is_named_so() -> None:
    why = refused(_fault(step=None), [_fault(step=None)])
    assert why is not None and "before the first step" in why


def test_a_fault_travels_through_the_store_unchanged() -> None:
    f = _fault()
    assert Fault.from_json(f.to_json()) == f


def test_a_long_error_is_cut_at_a_word_and_says_so() -> None:
    long = "connection closed by peer " * 20
    cut = shorten(long)
    assert len(cut) <= 200 and cut.endswith("…") and cut[:-1].split()[-1] in long.split()
    assert shorten("short\nsecond line") == "short" and shorten("") == ""
    assert shorten("x" * 300) == "x" * 199 + "…"  # one word longer than the limit: cut, and said


@pytest.mark.parametrize("timeout", [math.inf, math.nan, 0.0, -1.0, "20", True, 10**400])
def test_a_rejoin_time_that_is_not_a_finite_positive_number_is_a_clear_error(timeout: float) -> None:
    with pytest.raises(ConfigError, match="rejoin_timeout_s"):
        InProcess(None, backend="gloo", max_in_process_restarts=3, rejoin_timeout_s=timeout, timeout=None)


@pytest.mark.parametrize("most", [-1, "3", 2.5, True])
def test_max_in_process_restarts_that_is_not_a_count_is_a_clear_error(most: int) -> None:
    with pytest.raises(ConfigError, match="max_in_process_restarts"):
        InProcess(None, backend="gloo", max_in_process_restarts=most, rejoin_timeout_s=20.0, timeout=None)


def _waiting(terminated: bool, ended: list[int]) -> InProcess:
    topology = SimpleNamespace(restart_count=0, attempt=0, rank=1, world_size=2)
    rt = SimpleNamespace(topology=topology, rank=1, stop=SimpleNamespace(terminated=terminated))
    waiting = InProcess(rt, backend="gloo", max_in_process_restarts=3, rejoin_timeout_s=20.0, timeout=None)
    waiting._tasks = lambda: set(ended)  # type: ignore[assignment]  # srun's ended tasks, as slurmrt run tells
    return waiting


def test_a_rank_waiting_to_rejoin_gives_up_at_sigterm_or_when_srun_saw_a_task_end_and_waits_otherwise() -> None:
    later = time.monotonic() + 20
    assert _waiting(False, [])._why_not(1, later) == ""  # no news: wait on
    assert "SIGTERM" in _waiting(True, [])._why_not(1, later)
    assert "task(s) 1 end" in _waiting(False, [1])._why_not(1, later)
    assert "did not come back within 20 s" in _waiting(False, [])._why_not(1, time.monotonic() - 1)


def test_an_unhealthy_step_follows_its_own_ladder_not_the_rule_that_an_error_at_the_same_step_repeats() -> None:
    health = Fault(1, "TrainingHealthError: step 7", "TrainingHealthError", 6, 1.0e9, unhealthy=True)
    assert _plan(health, restarted=[health]).action is Action.IN_PROCESS_RESTART  # the rewind after the re-run
    ended = Fault(1, "TrainingHealthError: step 7", "TrainingHealthError", 6, 1.0e9, unhealthy=True,
                  refused="step 7 was unhealthy 2 times ... start again from checkpoint step_000000000")
    decision = _plan(ended, restarted=[health])
    assert decision.action is not Action.IN_PROCESS_RESTART and decision.in_process_refused == ended.refused
    assert Fault.from_json(ended.to_json()) == ended
