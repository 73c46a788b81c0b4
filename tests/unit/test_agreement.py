"""The clearance protocol, driven one round at a time without threads or collectives."""

from __future__ import annotations

from slurmrt.stop.agreement import DistributedAgreement, LocalAgreement
from slurmrt.stop.decision import Contribution, Reason, decode, encode


def _agreement() -> DistributedAgreement:
    return DistributedAgreement(lambda step, ahead, end: Contribution(step=step), None)  # type: ignore[arg-type]


def test_encode_then_max_then_decode_is_the_union_and_the_extremes() -> None:
    a = Contribution(reasons=frozenset({Reason.SIGNAL}), step=10, window=2, end_time=1000.0, term_time=50.0)
    b = Contribution(reasons=frozenset({Reason.DEADLINE}), step=11, window=5, term_time=40.0, save_unfit=True)
    reduced = decode([max(x, y) for x, y in zip(encode(a), encode(b), strict=True)])
    assert reduced.reasons == {Reason.SIGNAL, Reason.DEADLINE}
    assert (reduced.step, reduced.window, reduced.end_time) == (11, 5, 1000.0)
    assert reduced.term_time == 40.0  # the earliest SIGTERM
    assert reduced.save_unfit  # one rank short of time is enough to skip the save everywhere


def test_rounds_without_reasons_grant_a_clearance_that_lets_steps_run_without_waiting() -> None:
    ag = _agreement()
    ag._apply(Contribution(step=7, window=3))
    assert ag._cleared == 10
    assert ag.should_stop(8) is False and ag.should_stop(9) is False  # no wait, no thread started
    assert ag._thread is None


def test_a_round_with_a_reason_stops_everyone_at_the_previous_clearance() -> None:
    ag = _agreement()
    ag._apply(Contribution(step=7, window=3))  # cleared = 10: some rank may already be at 9
    ag._apply(Contribution(reasons=frozenset({Reason.SIGNAL}), step=9, window=3))
    assert ag.decision is not None and ag.decision.step == 10 and ag.decision.reasons == {Reason.SIGNAL}
    assert ag.should_stop(9) is False
    assert ag.should_stop(10) is True


def test_the_first_round_with_a_reason_stops_at_the_step_everyone_is_waiting_at() -> None:
    ag = _agreement()
    ag._apply(Contribution(reasons=frozenset({Reason.TERM}), step=0, save_unfit=True, term_time=5.0))
    assert ag.decision is not None and (ag.decision.step, ag.decision.save) == (0, False)


def test_a_finished_rank_ends_the_rounds_and_wins_over_a_late_stop() -> None:
    ag = _agreement()
    ag._apply(Contribution(step=98, window=2))
    done = ag._apply(Contribution(reasons=frozenset({Reason.SIGNAL}), step=99, leaving=True))
    assert done and ag.decision is None
    assert ag.should_stop(100) is False  # no round will come: a waiting rank is released


def test_clearance_never_moves_backwards() -> None:
    ag = _agreement()
    ag._apply(Contribution(step=50, window=10))
    ag._apply(Contribution(step=52, window=2))
    assert ag._cleared == 60


def test_local_agreement_stops_at_the_step_a_reason_is_seen() -> None:
    seen: list[frozenset[Reason]] = [frozenset(), frozenset(), frozenset({Reason.KILL_SWITCH})]
    ag = LocalAgreement(lambda step, ahead, end: Contribution(reasons=seen[step], step=step))
    assert [ag.should_stop(s) for s in range(3)] == [False, False, True]
    assert ag.decision is not None and ag.decision.step == 2 and ag.decision.reason is Reason.KILL_SWITCH
    assert ag.should_stop(3) is True
