from __future__ import annotations

import os
import signal

import pytest

from slurmrt.stop.signals import SignalRecorder, parse_signal


def test_handler_records_first_arrival_and_counts_repeats() -> None:
    rec = SignalRecorder([signal.SIGUSR1, signal.SIGTERM])
    assert rec.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        first = rec.first_seen[signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)
        assert rec.count[signal.SIGTERM] == 3 and rec.first_seen[signal.SIGTERM] == first
        assert rec.count[signal.SIGUSR1] == 1
    finally:
        rec.close()


def test_previous_python_handlers_are_chained_and_restored() -> None:
    calls: list[int] = []

    def mine(signum: int, frame: object) -> None:
        calls.append(signum)

    old = signal.signal(signal.SIGUSR2, mine)
    try:
        rec = SignalRecorder([signal.SIGUSR2])
        rec.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [signal.SIGUSR2] and signal.SIGUSR2 in rec.first_seen
        rec.close()
        assert signal.getsignal(signal.SIGUSR2) is mine
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_first_sigint_is_recorded_and_the_second_interrupts() -> None:
    # Python's own handler first, whatever the test runner inherited: a shell that starts it in the background
    # (`cmd &` without job control) hands it SIGINT ignored.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rec = SignalRecorder([signal.SIGINT])
        rec.install()
        try:
            os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt with Python's default handler
            assert signal.SIGINT in rec.first_seen
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        finally:
            rec.close()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.parametrize("value", ["USR1", "SIGUSR1", "usr1", 10, "10", signal.SIGUSR1])
def test_parse_signal_accepts_the_spellings_sbatch_uses(value: object) -> None:
    assert parse_signal(value) is signal.SIGUSR1  # type: ignore[arg-type]


def test_parse_signal_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown signal 'USR3'"):
        parse_signal("USR3")


def test_reclaim_puts_the_recorder_back_where_a_framework_replaced_it_and_keeps_the_chain() -> None:
    seen: list[str] = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: seen.append("user"))
    rec = SignalRecorder([signal.SIGUSR1, signal.SIGUSR2])
    try:
        assert rec.install()
        signal.signal(signal.SIGUSR2, lambda s, f: seen.append("framework"))  # what Lightning does to SIGTERM
        assert rec.reclaim() == [signal.SIGUSR2] and rec.reclaim() == []
        os.kill(os.getpid(), signal.SIGUSR2)
        assert signal.SIGUSR2 in rec.first_seen and seen == ["user"], "recorded, then the handler from before init"
    finally:
        rec.close()
        signal.signal(signal.SIGUSR2, previous)
