"""Stragglers: the timer's windows, the MAX reduction of their timing, and the judgement every rank makes alike."""

from __future__ import annotations

import os

import pytest

from slurmrt import Options
from slurmrt._errors import ConfigError
from slurmrt.stop import straggler as mod
from slurmrt.stop.decision import Contribution, Reason, decode, encode
from slurmrt.stop.straggler import ComputeTimer, StragglerJudge, Timing


def _reduce(timings: list[Timing]) -> Timing:
    return Timing.decode([max(v) for v in zip(*(t.encode() for t in timings), strict=True)])


def _window(number: int, means_us: list[int], suspect: int | None = None, nodes: list[int] | None = None,
            step_us: int = 100_000) -> Timing:
    """The reduced timing of one window in which rank r, on node nodes[r] (r), took means_us[r] in its section."""
    parts = []
    for rank, mean in enumerate(means_us):
        timer = ComputeTimer()
        timer.published = (number, mean, step_us)
        parts.append(timer.timing(rank, rank if nodes is None else nodes[rank], suspect))
    return _reduce(parts)


def _judged(judge: StragglerJudge, number: int, means_us: list[int], nodes: list[int] | None = None) -> int | None:
    """One round on window ``number``, each rank's part made with the judge's suspect as the agreement makes it; the
    rank named, if any."""
    s = judge.observe(_window(number, means_us, judge.suspect, nodes))
    return None if s is None else s.rank


def test_the_reduction_keeps_the_slowest_rank_with_its_node_and_the_slowest_mean_elsewhere() -> None:
    t = _window(4, [50_000, 90_000, 51_000, 49_000], suspect=1)
    s = mod.slow_in(t, 0.25, suspect=1)
    assert s is not None and s.rank == 1 and s.window == 4
    assert (s.slow_s, s.others_s, s.step_s) == (0.09, 0.051, 0.1)
    assert s.ratio == pytest.approx(90 / 51) and s.cost == pytest.approx(0.39)


def test_the_timing_rides_the_agreement_round_unchanged() -> None:
    timer = ComputeTimer()
    timer.published = (2, 1234, 5678)
    c = Contribution(reasons=frozenset({Reason.STRAGGLER}), step=9, timing=timer.timing(7, 3, None))
    back = decode(encode(c))
    assert back.timing == timer.timing(7, 3, None) and back.reasons == {Reason.STRAGGLER} and back.step == 9


@pytest.mark.parametrize(("means", "suspect", "why"), [
    ([50_000, 60_000], 1, "20 % slower: under the margin"),
    ([1_000, 3_000], 1, "3x slower, but 2 ms of a 100 ms step: under 5 % of a step"),
    ([50_000, 50_000], 1, "equal"),
    ([50_000, 90_000], None, "no suspect yet: this window makes node 1 the suspect"),
    ([90_000, 50_000], 1, "the slowest is not on the suspect's node"),
])
def test_a_window_is_not_slow_below_the_margin_or_the_cost_or_off_the_suspect(means: list[int], suspect: int | None,
                                                                             why: str) -> None:
    assert mod.slow_in(_window(0, means, suspect), 0.25, suspect) is None, why


def test_a_slow_node_is_compared_with_the_slowest_rank_of_the_other_nodes() -> None:
    # Ranks 2 and 3 share node 1, which is slow: compared rank against rank, rank 3 would be only 82/80 of rank 2.
    judge = StragglerJudge(margin=0.25, windows=2)
    nodes = [0, 0, 1, 1]
    assert [_judged(judge, n, [50_000, 51_000, 80_000, 82_000], nodes) for n in range(3)] == [None, None, 3]
    assert judge.named is not None and judge.named.others_s == 0.051


def test_ranks_starved_by_turns_are_not_named() -> None:
    # A machine whose cores are shared: ranks 1 and 2 by turns get half the CPU rank 0 gets. Each is 2x the fastest
    # rank in its windows; neither is slower than the rest, and leaving one node out would not speed the job.
    judge = StragglerJudge(margin=0.25, windows=2)
    seq = [[20_000, 40_000, 38_000], [20_000, 39_000, 41_000], [20_000, 42_000, 40_000], [20_000, 40_000, 43_000]]
    assert all(_judged(judge, n, m) is None for n, m in enumerate(seq))


def test_named_after_the_windows_in_a_row_and_only_once() -> None:
    judge = StragglerJudge(margin=0.25, windows=3)
    named = [_judged(judge, n, [50_000, 50_000, 80_000]) for n in range(6)]
    assert named == [None, None, None, 2, None, None]  # window 0 makes node 2 the suspect; 1, 2 and 3 are slow
    assert judge.named is not None and judge.named.rank == 2


def test_a_window_that_is_not_slow_starts_the_count_again() -> None:
    judge = StragglerJudge(margin=0.25, windows=2)
    seq = [[50_000, 80_000], [50_000, 80_000], [50_000, 50_000], [50_000, 80_000]]
    assert [_judged(judge, n, m) for n, m in enumerate(seq)] == [None, None, None, None]
    assert _judged(judge, 4, [50_000, 80_000]) == 1


def test_another_rank_slowest_starts_the_count_again() -> None:
    judge = StragglerJudge(margin=0.25, windows=2)
    assert _judged(judge, 0, [50_000, 80_000, 50_000]) is None  # node 1 the suspect
    assert _judged(judge, 1, [50_000, 80_000, 50_000]) is None  # one slow window
    assert _judged(judge, 2, [50_000, 50_000, 80_000]) is None  # node 2 now: the new suspect
    assert _judged(judge, 3, [50_000, 50_000, 80_000]) is None
    assert _judged(judge, 4, [50_000, 50_000, 80_000]) == 2


def test_a_round_at_a_window_edge_or_one_seen_before_is_not_judged() -> None:
    judge = StragglerJudge(margin=0.25, windows=1)
    assert _judged(judge, 2, [50_000, 90_000]) is None  # node 1 the suspect
    a, b = ComputeTimer(), ComputeTimer()
    a.published, b.published = (3, 50_000, 100_000), (2, 90_000, 100_000)  # rank 1 has not closed window 3 yet
    assert judge.observe(_reduce([a.timing(0, 0, judge.suspect), b.timing(1, 1, judge.suspect)])) is None
    assert _judged(judge, 3, [50_000, 90_000]) == 1
    judge.named = None
    assert _judged(judge, 3, [50_000, 90_000]) is None  # the same window, in the next round


def test_ranks_that_time_nothing_make_no_judgement() -> None:
    judge = StragglerJudge(margin=0.25, windows=1)
    assert judge.observe(_reduce([Timing(), Timing()])) is None
    for number in range(3):
        timer = ComputeTimer()
        timer.published = (number, 90_000, 100_000)
        # one rank times, the other does not
        assert judge.observe(_reduce([timer.timing(0, 0, judge.suspect), Timing()])) is None


def test_the_timer_closes_a_window_of_means_every_window_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.01, 0.1, 0.13, 0.2, 0.21, 0.3, 0.33])  # sections of 10 and 30 ms
    monkeypatch.setattr(mod, "_now", lambda: next(clock))
    monkeypatch.setattr(mod, "SCHEDSTAT", "/nonexistent/schedstat")  # no run-queue figures: the wall time is used
    timer = ComputeTimer(window=2, step_s=lambda: 0.1)
    for _ in range(4):
        with timer:
            pass
    assert timer.published == (1, 20_000, 100_000)  # the second window: its mean, and the measured step time
    t = timer.timing(5, 2, suspect=2)
    assert (t.slowest, t.slowest_node, t.others) == (20_000 << 24 | 5, 20_000 << 24 | 2, -1)
    assert timer.timing(5, 2, suspect=1).others == 20_000


def test_each_sections_wait_for_a_core_is_taken_out_and_stopped_time_is_kept_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The thread's statistics (time ran, time waited in the run queue, ns) stood in, read as each section starts
    # and ends. Window 0: sections of 40 ms that each waited 20 ms for a core. Window 1: sections of 40 ms with no
    # wait inside, 60 ms of wait between them (not the section's). Window 2: a stopped process (SIGSTOP, a throttled
    # node) whose 40 ms sections ran 5 ms, waited 10 ms and were stopped 25 ms: its own time is 30 ms, where
    # scaling by its share of runnable time said 13 ms and hid the slow node.
    waits = iter([0, 20, 20, 40,  100, 100, 160, 160,  160, 170, 170, 180])  # ms, at each start and end
    ran = iter([0, 20, 20, 40,  40, 80, 80, 120,  120, 125, 125, 130])
    monkeypatch.setattr(mod, "_open_schedstat", lambda: 99)
    monkeypatch.setattr(mod, "_pread", lambda fd, n, off: f"{next(ran) * 10**6} {next(waits) * 10**6} 1\n".encode())
    clock = iter(x / 1000 for start in range(0, 600, 100) for x in (start, start + 40))
    monkeypatch.setattr(mod, "_now", lambda: next(clock))
    timer = ComputeTimer(window=2, step_s=lambda: 0.1)
    published = []
    for _ in range(6):
        with timer:
            pass
        published.append(timer.published)
    assert published[1::2] == [(0, 20_000, 100_000), (1, 40_000, 100_000), (2, 30_000, 100_000)]


def test_a_thread_whose_statistics_cannot_be_read_is_timed_by_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = iter([b"0 0 1\n", b"0 5000000 1\n", OSError(5, "gone")])

    def pread(fd: int, n: int, off: int) -> bytes:
        value = next(reads)
        if isinstance(value, Exception):
            raise value
        return value

    fd = os.open(os.devnull, os.O_RDONLY)  # a real descriptor for the timer to close when the statistics go
    monkeypatch.setattr(mod, "_open_schedstat", lambda: fd)
    monkeypatch.setattr(mod, "_pread", pread)
    clock = iter([0.0, 0.04, 0.1, 0.14])
    monkeypatch.setattr(mod, "_now", lambda: next(clock))
    timer = ComputeTimer(window=2)
    for _ in range(2):
        with timer:
            pass
    # the first section waited 5 ms; the second lost its statistics as it began and counts its wall time whole
    assert timer.published == (0, 37_500, 0)
    with pytest.raises(OSError):  # closed by the timer, once
        os.fstat(fd)


def test_options_name_the_rule_of_a_bad_value() -> None:
    with pytest.raises(ConfigError, match="straggler='kill'.*name, exclude, replace"):
        Options.resolve({"straggler": "kill"}, {})
    with pytest.raises(ConfigError, match="straggler_margin"):
        Options.resolve({}, {"SLURMRT_STRAGGLER_MARGIN": "-1"})
    with pytest.raises(ConfigError, match="straggler_window"):
        Options.resolve({}, {"SLURMRT_STRAGGLER_WINDOW": "1"})
    o = Options.resolve({}, {"SLURMRT_STRAGGLER": "Replace", "SLURMRT_STRAGGLER_MARGIN": "0.5"})
    assert (o.straggler, o.straggler_margin, o.straggler_window, o.straggler_windows) == ("replace", 0.5, 20, 3)


# -- what the name costs the node: conclude() at the end of the run (rank 0, with Slurm's commands stood in) --------


