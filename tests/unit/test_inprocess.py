"""The in-process restart's decision (runtime/inprocess.py): pure, the same on every rank."""

from __future__ import annotations

from slurmrt.runtime.inprocess import Fault, refusal


def _fault(kind: str = "RuntimeError", step: int | None = 7, rank: int = 1) -> Fault:
    return Fault(rank, f"{kind}: boom", kind, step, 1.0e9)


def test_a_first_fault_is_restarted() -> None:
    assert refusal(_fault(), restarted=[], max_restarts=3, stopping=False) is None


def test_the_same_error_at_the_same_step_is_not_restarted_twice_whichever_rank_raised_it() -> None:
    why = refusal(_fault(rank=2), restarted=[_fault(rank=1)], max_restarts=3, stopping=False)
    assert why is not None and "repeats" in why and "step 7" in why


def test_another_error_or_another_step_is_restarted_again() -> None:
    assert refusal(_fault("ValueError"), restarted=[_fault()], max_restarts=3, stopping=False) is None
    assert refusal(_fault(step=8), restarted=[_fault()], max_restarts=3, stopping=False) is None


def test_max_restarts_bounds_the_restarts() -> None:
    earlier = [_fault(step=s) for s in (1, 2)]
    assert refusal(_fault(step=3), restarted=earlier[:1], max_restarts=2, stopping=False) is None
    why = refusal(_fault(step=3), restarted=earlier, max_restarts=2, stopping=False)
    assert why is not None and "max_restarts=2" in why
    assert refusal(_fault(), restarted=[], max_restarts=0, stopping=False) is not None


def test_an_error_after_an_agreed_stop_ends_the_run_as_it_would_have() -> None:
    why = refusal(_fault(), restarted=[], max_restarts=3, stopping=True)
    assert why is not None and "stop" in why


def test_a_fault_before_the_first_step_is_named_so() -> None:
    why = refusal(_fault(step=None), restarted=[_fault(step=None)], max_restarts=3, stopping=False)
    assert why is not None and "before the first step" in why


def test_a_fault_travels_through_the_store_unchanged() -> None:
    f = _fault()
    assert Fault.from_json(f.to_json()) == f
