"""Every number is bounded before it is used (issue 53, class 2): records that are valid JSON but hold no valid
figure (NaN, Infinity, 1e999, a 400-digit integer, a negative duration, a value nested deep) are skipped with a
warning or refused with one line, never a traceback; `--json` output is RFC 8259 JSON (no NaN, no Infinity)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrt.cli import main
from slurmrt.record import goodput, timeline
from slurmrt.record.events import read_events
from slurmrt.record.ledger import Ledger
from slurmrt.record.runs import measured_earlier, runs_of

#: A figure as a careless writer or a hostile neighbour leaves it: any number JSON can carry, and then some.
FIGURES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1e300, -1.0, -1e6, 0.0, 1e-300]),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=-3, max_value=100),
    st.just("1e999"),  # raw text in the line: Python's json reads it as inf
    st.booleans(),
    st.recursive(st.integers(0, 3), lambda inner: st.lists(inner, max_size=2), max_leaves=4),
)
#: The numeric fields of the events slurmrt reads back to decide or to show, by event.
TEMPLATES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("init", {"world_size": 2, "nnodes": 1, "nodelist": ["n1"], "master": "n1:1", "job_nodes": 1},
     ("world_size", "nnodes", "job_nodes")),
    ("resume", {"step": 10, "tier": "shared", "from_peers": 0, "local_held": 5, "seconds": 0.5},
     ("step", "from_peers", "local_held", "seconds")),
    ("progress", {"step": 20, "step_s": 0.1}, ("step", "step_s")),
    ("save", {"step": 20, "seconds": 0.3, "bytes": 100, "blocking": True, "started": 1.8e9, "stall": 0.3},
     ("step", "seconds", "bytes", "started", "stall")),
    ("decision", {"step": 25, "step_s": 0.1, "save_s": 0.3, "end_time": 1.8e9, "reasons": ["deadline"]},
     ("step", "step_s", "save_s", "end_time")),
    ("phase", {"name": "eval", "seconds": 2.0}, ("seconds",)),
    ("hang", {"node": "n1", "step": 26, "idle_s": 200.0, "allowed_s": 180.0, "activity": "step"},
     ("step", "idle_s", "allowed_s")),
    ("straggler", {"straggler": 1, "node": "n1", "ratio": 2.0, "cost": 0.5}, ("ratio", "cost")),
    ("exit", {"code": 3, "outcome": "REQUEUED", "why": "x", "step": 26, "lead": True}, ("code", "step")),
]


def _line(event: dict[str, Any], raw: dict[str, str]) -> str:
    text = json.dumps(event)  # NaN and Infinity as Python writes them
    for key, value in raw.items():  # a figure written as raw text
        text = text.replace(json.dumps(f"@@{key}@@"), value)
    return text


@st.composite
def event_logs(draw: Any) -> list[str]:
    start = datetime(2026, 11, 27, 1, 0, tzinfo=timezone.utc)
    lines = []
    for restart in range(draw(st.integers(1, 2))):
        for n, (name, fields, numeric) in enumerate(TEMPLATES):
            event = {"time": (start + timedelta(seconds=100 * restart + n)).isoformat(), "event": name, "job": "5",
                     "restart": restart, "rank": 0, **fields}
            raw = {}
            for key in numeric:
                if draw(st.booleans()):
                    value = draw(FIGURES)
                    if isinstance(value, str):
                        raw[key], value = value, f"@@{key}@@"
                    event[key] = value
            lines.append(_line(event, raw))
    if draw(st.booleans()):
        lines.append("DEEP")  # replaced by a line nested past Python's recursion limit
    return lines


def _run_cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, out.getvalue()


def _strict(text: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"--json wrote {token}: not RFC 8259")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.stragglers  # its logs hold straggler events on purpose
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(lines=event_logs())
def test_every_reader_of_an_event_log_skips_what_is_not_a_figure(tmp_path: Path, lines: list[str]) -> None:
    directory = tmp_path / "logs"
    directory.mkdir(exist_ok=True)
    log = directory / "events-5.jsonl"
    log.write_text("\n".join(lines).replace("DEEP", "[" * 50_000 + "]" * 50_000) + "\n")
    logging.disable(logging.WARNING)  # the skips' warnings, one per line: not what is tested here
    try:
        events = list(read_events(log))
        runs_of(log)
        measured_earlier(log)
        life = timeline.build(events)
        goodput.account(events, life)
        code, _ = _run_cli(["status", str(directory)])
        assert code in (0, 1, 2)
        for argv in (["status", "--json", str(directory)], ["doctor", "--json", "--events", str(log)]):
            code, out = _run_cli(argv)
            assert code in (0, 1, 2), argv
            _strict(out)
    finally:
        logging.disable(logging.NOTSET)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=FIGURES, last=FIGURES, count=FIGURES)
def test_a_bad_node_ledger_entry_out_of_bounds_is_ignored(tmp_path: Path, first: Any, last: Any, count: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bad-nodes.json"
    entry = {"reason": "hang", "job": "5", "first": first, "last": last, "count": count}
    raw = {k: entry.pop(k) for k in ("first", "last", "count") if isinstance(entry[k], str)}
    entry.update({k: f"@@{k}@@" for k in raw})
    good = {"reason": "lost", "job": "5", "first": 1.8e9, "last": 1.8e9, "count": 2}
    path.write_text(_line({"version": 1, "nodes": {"n1": entry, "n2": good}}, raw))
    ledger = Ledger(path)
    ledger.entries()
    ledger.nodes()
    monkeypatch.setenv("SLURMRT_NODE_LEDGER", str(path))
    for argv in (["nodes", "--cluster", "c"], ["nodes", "--cluster", "c", "--sbatch"]):  # --cluster: no scontrol
        code, out = _run_cli(argv)
        assert code == 0 and "n2" in out, argv


@pytest.mark.parametrize("given_", [{"mtbf_node_h": 1e306}, {"mtbf_node_h": "1" * 400}, {"keep_last": 10**400},
                                    {"progress_s": float("inf")}, {"hang_floor_s": "nan"}, {"save_time_s": 1e300}])
def test_an_option_out_of_bounds_is_refused_in_one_line(given_: dict[str, Any]) -> None:
    from slurmrt._errors import ConfigError
    from slurmrt.options import Options

    with pytest.raises(ConfigError) as err:
        Options.resolve(given_, {})
    (name,) = given_
    message = str(err.value)
    assert "\n" not in message and name in message and len(message) < 200


def test_a_400_digit_mtbf_is_refused_in_one_line() -> None:
    code, _ = _run_cli(["sim", "--mtbf", "1" * 400, "--", "true"])
    assert code == 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jumps=st.lists(st.floats(min_value=-120.0, max_value=60.0), min_size=len(TEMPLATES) * 2,
                      max_size=len(TEMPLATES) * 2))
@pytest.mark.stragglers  # its logs hold straggler events on purpose
def test_a_clock_that_steps_back_never_gives_a_negative_second(tmp_path: Path, jumps: list[float]) -> None:
    """Issue 53, class 3: the events of two runs, each dated by a wall clock that may step back (NTP, a VM resumed,
    a node whose clock is behind). The ledger has no negative category, and `status` (its chart too) does not
    raise."""
    directory = tmp_path / "logs"
    directory.mkdir(exist_ok=True)
    start, offset, lines = datetime(2026, 11, 27, 1, 0, tzinfo=timezone.utc), 0.0, []
    for restart in range(2):
        for n, (name, fields, _) in enumerate(TEMPLATES):
            offset += jumps[restart * len(TEMPLATES) + n]
            lines.append(json.dumps({"time": (start + timedelta(seconds=offset)).isoformat(), "event": name,
                                     "job": "5", "restart": restart, "rank": 0, **fields}))
    log = directory / "events-5.jsonl"
    log.write_text("\n".join(lines) + "\n")
    logging.disable(logging.WARNING)
    try:
        events = list(read_events(log))
        ledger = goodput.account(events, timeline.build(events))
        assert all(v >= 0 for v in ledger.seconds.values()), ledger.seconds
        assert all(v >= 0 for r in ledger.runs for v in r.seconds.values())
        code, out = _run_cli(["status", str(directory)])
        assert code == 0, out
    finally:
        logging.disable(logging.NOTSET)


def test_an_event_dated_in_the_future_is_skipped_and_stretches_no_ledger(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A time must lie within the job's life: an event dated 2150 (a damaged line, a clock set by hand) would make
    the ledger's wall time a century long."""
    now = datetime.now(timezone.utc)
    base = {"job": "5", "restart": 0, "rank": 0}
    lines = [{"time": now.isoformat(), "event": "init", **base},
             {"time": (now + timedelta(seconds=30)).isoformat(), "event": "exit", "outcome": "FINISHED", **base},
             {"time": "2150-01-01T00:00:00+00:00", "event": "progress", "step": 9, **base}]
    path = tmp_path / "events-5.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    with caplog.at_level(logging.WARNING):
        events = list(read_events(path))
    assert [e["event"] for e in events] == ["init", "exit"]
    assert "is not between 1970 and a day from now" in caplog.text
    assert goodput.account(events).wall_s == pytest.approx(30.0, abs=1.0)


def test_an_event_dated_hours_ahead_of_its_neighbours_takes_their_time_and_is_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Inside the day's tolerance, a line dated 5 h ahead (a host whose clock is ahead, a line written by hand) was
    kept, and every later event was moved to its date: the run lasted 5 h in the ledger, and the warning named the
    line after it. Judged against both its neighbours, it is the one that is off."""
    start = datetime.now(timezone.utc) - timedelta(minutes=5)
    base = {"job": "5", "restart": 0, "rank": 0}
    times = [0.0, 10.0, 5 * 3600.0, 20.0, 30.0]
    names = ["init", "progress", "progress", "progress", "exit"]
    lines = [{"time": (start + timedelta(seconds=t)).isoformat(), "event": name, "step": n, **base}
             for n, (t, name) in enumerate(zip(times, names, strict=True))]
    lines[-1]["outcome"] = "FINISHED"
    path = tmp_path / "events-5.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    with caplog.at_level(logging.WARNING):
        events = list(read_events(path))
    assert [e["step"] for e in events] == [0, 1, 2, 3, 4]  # nothing lost
    assert goodput.account(events).wall_s == pytest.approx(30.0, abs=1.0)
    assert f"{path}:3 is dated 17980 s after the event written after it" in caplog.text, caplog.text
