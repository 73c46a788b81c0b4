"""The exit policy, part of the one recovery plan (a pure function): every way a run can end, and the exit code each
one gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmrt import ExitCode, Outcome, Reason, StopDecision
from slurmrt.recovery.facts import Facts
from slurmrt.recovery.plan import Action, Decision, Trigger, plan
from slurmrt.recovery.settings import RecoverySection

FACTS = {"requeue_enabled": True, "is_slurm": True, "restart_count": 0, "max_restarts": None}


def choose(decision: StopDecision | None, *, requeue_enabled: bool, is_slurm: bool, restart_count: int,
           max_restarts: int | None, kill_switch: Path | None = None) -> Decision:
    facts = Facts(job="7" if is_slurm else None, restart_count=restart_count, kill_switch=kill_switch,
                  policy=RecoverySection(requeue=requeue_enabled, max_restarts=max_restarts))
    return plan(Trigger.FINISHED if decision is None else Trigger.STOPPED, facts, stop=decision)


def after_failed_save(outcome: Outcome) -> Outcome:
    """The outcome of a run that would have ended with ``outcome``, had its last save not failed."""
    stops = {Outcome.FINISHED: None, Outcome.KILL_SWITCH: _stop(Reason.KILL_SWITCH),
             Outcome.REQUEUED: _stop(Reason.SIGNAL), Outcome.STOPPED: _stop(Reason.INTERRUPT)}
    facts = Facts(job="7", kill_switch=Path("/shared/STOP"))
    decision = plan(Trigger.FINISHED if stops[outcome] is None else Trigger.STOPPED, facts, stop=stops[outcome],
                    failed_save=True)
    return decision.outcome


def _stop(*reasons: Reason, term: float | None = None, end: float | None = None) -> StopDecision:
    return StopDecision(step=10, reasons=frozenset(reasons), save=True, end_time=end, term_time=term)


@pytest.mark.parametrize(("decision", "facts", "expected"), [
    (None, {}, Outcome.FINISHED),
    (_stop(Reason.KILL_SWITCH, Reason.SIGNAL), {}, Outcome.KILL_SWITCH),
    (_stop(Reason.INTERRUPT), {}, Outcome.STOPPED),
    (_stop(Reason.TERM, term=100.0, end=1000.0), {}, Outcome.STOPPED),  # scancel or preemption
    (_stop(Reason.TERM, term=990.0, end=1000.0), {}, Outcome.REQUEUED),  # the time limit
    (_stop(Reason.SIGNAL), {}, Outcome.REQUEUED),
    (_stop(Reason.DEADLINE), {}, Outcome.REQUEUED),
    (_stop(Reason.SIGNAL), {"requeue_enabled": False}, Outcome.STOPPED),
    (_stop(Reason.SIGNAL), {"is_slurm": False}, Outcome.STOPPED),
    (_stop(Reason.SIGNAL), {"restart_count": 3, "max_restarts": 3}, Outcome.STOPPED),
    (_stop(Reason.SIGNAL), {"restart_count": 2, "max_restarts": 3}, Outcome.REQUEUED),
])
def test_each_way_a_run_ends_has_its_outcome(decision: StopDecision | None, facts: dict[str, object],
                                             expected: Outcome) -> None:
    verdict = choose(decision, **{**FACTS, **facts}, kill_switch=Path("/shared/STOP"))  # type: ignore[arg-type]
    assert verdict.outcome is expected
    assert (verdict.action is Action.REQUEUE) is (expected is Outcome.REQUEUED)


def test_the_kill_switch_is_its_own_outcome_and_exits_zero_like_a_finished_run() -> None:
    verdict = choose(_stop(Reason.KILL_SWITCH), **FACTS, kill_switch=Path("/shared/STOP"))  # type: ignore[arg-type]
    assert verdict.outcome is Outcome.KILL_SWITCH and verdict.outcome is not Outcome.FINISHED
    assert verdict.outcome.code is ExitCode.FINISHED and "/shared/STOP" in verdict.why


@pytest.mark.parametrize(("outcome", "after"), [
    (Outcome.FINISHED, Outcome.FAILED),
    (Outcome.KILL_SWITCH, Outcome.FAILED),
    (Outcome.REQUEUED, Outcome.REQUEUED),  # resumes from the checkpoint before
    (Outcome.STOPPED, Outcome.STOPPED),  # already non-zero
])
def test_a_failed_last_save_fails_only_a_run_that_ends_for_good(outcome: Outcome, after: Outcome) -> None:
    assert after_failed_save(outcome) is after


def test_every_exit_code_but_the_kill_switch_belongs_to_one_outcome() -> None:
    # A lost peer exits with a hang's code (the batch scripts' rule is the same); its record says which it was
    codes = [o.code for o in Outcome if o not in (Outcome.KILL_SWITCH, Outcome.PEER_LOST)]
    # CONFIG ends init() itself, before there is a run with an outcome (runtime/misconfigured.py)
    assert sorted(codes) == sorted(c for c in ExitCode if c is not ExitCode.CONFIG)
