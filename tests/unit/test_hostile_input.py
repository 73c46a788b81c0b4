"""Malformed values and malformed files: a clear error or a clear warning, never a protection silently off, never a
traceback. Property-based (hypothesis) for every parser; the command line fed random bytes and wrong types.

Each named case failed on the main before the "nothing lost, nobody in" issue.
"""

from __future__ import annotations

import json
import os
import signal
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slurmrt
from slurmrt import ConfigError, EnvironmentVariableError, HostlistError, Options, ParallelConfig
from slurmrt.cli import main
from slurmrt.cli.doctor import doctor
from slurmrt.launch import hostlist
from slurmrt.launch.topology import from_environ
from slurmrt.options import unknown_variables
from slurmrt.record.events import malformed, read_events
from slurmrt.sim.spec import JobSpec, apply_option
from slurmrt.stop.killswitch import exists

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC")):
            monkeypatch.delenv(key)
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


# -- options: one place, the value, the rule, the fix ---------------------------------------------------------------

@pytest.mark.parametrize(("given_", "match"), [
    ({"kill_switch": ""}, r"kill_switch='' .*empty path"),
    ({"checkpoint_dir": "  "}, r"checkpoint_dir='  ' .*empty path"),
    ({"kill_switch_poll_s": 0}, r"kill_switch_poll_s=0 .*at least 0.01"),
    ({"kill_switch_poll_s": -1}, r"kill_switch_poll_s=-1 .*at least 0.01"),
    ({"kill_wait_s": -1}, r"kill_wait_s=-1 .*at least 0"),
    ({"save_time_s": -5}, r"save_time_s=-5"),
    ({"deadline_margin_s": float("nan")}, r"deadline_margin_s=nan .*finite"),
    ({"end_time_refresh_s": -1}, r"end_time_refresh_s=-1"),
    ({"signals": "KILL"}, r"SIGKILL cannot be caught"),
    ({"signals": "STOP USR1"}, r"SIGSTOP cannot be caught"),
    ({"signals": "BOGUS"}, r"unknown signal"),
    ({"deadline": "ture"}, r"deadline='ture' .*must not turn a protection off"),
    ({"keep_last": 0}, r"keep_last=0 .*at least 1"),
    ({"keep_last": 1.5}, r"keep_last=1.5 .*whole number"),
    ({"save_threads": True}, r"save_threads=True .*whole number"),
    ({"save_nice": -5}, r"save_nice=-5 .*at least 0"),
    ({"max_futile_runs": 0}, r"max_futile_runs=0"),
    ({"progress_s": 0}, r"progress_s=0 .*at least 1"),  # an event per step (issue 40); "none" turns it off
    ({"log_handler": "maybe"}, r"log_handler='maybe'"),
])
def test_a_malformed_option_is_refused_with_its_value_and_rule(given_: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Options.resolve(given_, {})


@pytest.mark.parametrize(("name", "raw"), [("SLURMRT_KILL_SWITCH_POLL_S", "0"), ("SLURMRT_KILL_SWITCH_POLL_S", "-1"),
                                           ("SLURMRT_KILL_WAIT_S", "-3"), ("SLURMRT_SAVE_TIME_S", "-1"),
                                           ("SLURMRT_DEADLINE_MARGIN_S", "-30"), ("SLURMRT_END_TIME_REFRESH_S", "-9"),
                                           ("SLURMRT_SIGNALS", "KILL"), ("SLURMRT_WATCHDOG", "maybe"),
                                           ("SLURMRT_DEADLINE", "nope"), ("SLURMRT_KEEP_LAST", "two")])
def test_a_malformed_slurmrt_variable_is_refused_naming_it(name: str, raw: str) -> None:
    option = name.removeprefix("SLURMRT_").lower()
    with pytest.raises(ConfigError, match=rf"{option}={raw!r}"):
        Options.resolve({}, {name: raw})


def test_init_refuses_an_empty_kill_switch_instead_of_stopping_every_job(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # "" used to become ".", which exists: exit 0 at init, and an array drained
    with pytest.raises(ConfigError, match="empty path"):
        slurmrt.init(kill_switch="")


def test_init_refuses_signals_that_cannot_be_caught_with_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMRT_SIGNALS", "KILL")
    with pytest.raises(ConfigError, match="SIGKILL cannot be caught"):
        slurmrt.init()


def test_a_misspelt_slurmrt_variable_is_named() -> None:
    assert unknown_variables({"SLURMRT_KILLSWITCH": "/x", "SLURMRT_KILL_SWITCH": "/y", "SLURMRT_TP": "2",
                              "SLURMRT_LOCK_FILE": "/l"}) == ["SLURMRT_KILLSWITCH"]


@pytest.mark.parametrize("raw", ["abc", "-5", "1.5e9", " 17", "1_700_000_000"])
def test_a_malformed_job_end_time_is_refused_not_a_deadline_turned_off(raw: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_JOB_END_TIME", raw)
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue
    with pytest.raises(EnvironmentVariableError, match="SLURM_JOB_END_TIME"):
        slurmrt.init()
    report = doctor({"SLURM_JOB_ID": "99", "SLURM_JOB_END_TIME": raw}, ParallelConfig(), events_dirs=[tmp_path])
    assert report.failed and any("FAIL  time" in line and "SLURM_JOB_END_TIME" in line for line in report.lines)


# -- the kill switch that could never fire ---------------------------------------------------------------------

def test_a_kill_switch_under_a_file_or_a_dangling_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match="can never be created: .*file is not a directory"):
        exists(tmp_path / "file" / "STOP")
    with pytest.raises(ConfigError, match="dangling is a dangling symlink"):
        exists(tmp_path / "dangling" / "STOP")
    assert exists(tmp_path / "later" / "STOP") is False  # a directory made later: a warning only


# -- slurmrt env: init()'s checks ------------------------------------------------------------------------------

ALLOCATION = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_NTASKS": "4",
              "SLURM_TASKS_PER_NODE": "2(x2)"}


@pytest.mark.parametrize(("extra", "match"), [({"MASTER_PORT": "70000"}, "not a TCP port"),
                                              ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not an integer"),
                                              ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be >= 1"),
                                              ({"WORLD_SIZE": "-4"}, "WORLD_SIZE='-4' must be >= 1"),
                                              ({"SLURM_NTASKS": "5"}, r"adds up to 4 tasks but SLURM_NTASKS=5"),
                                              ({"SLURM_NNODES": "3"}, "SLURM_NNODES=3 but")])
def test_slurmrt_env_refuses_what_init_refuses(extra: dict[str, str], match: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in {**ALLOCATION, **extra}.items():
        monkeypatch.setenv(key, value)
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and __import__("re").search(match, err), err
    with pytest.raises(ConfigError, match=match):
        from_environ({**ALLOCATION, **extra})


# -- the command line never prints a traceback ------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"\x00\xff\xfe\x80 binary", b"", b"[1,2]\n", b'{"a": 1}\n', b'"text"\n',
                                     b'{"event": "save", "time": 5, "step": "x"}\n',
                                     b'{"event": "save", "time": "2026-01-01T00:00:00", "restart": "x"}\n'])
def test_status_on_a_damaged_event_log_says_so_in_one_line(content: bytes, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events-1.jsonl").write_bytes(content)
    assert main(["status", str(tmp_path)]) == 1
    assert "no slurmrt event in" in capsys.readouterr().out


def test_doctor_health_survives_a_damaged_event_log_in_the_submit_directory(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "events-1.jsonl").write_bytes(b'\xff[1,2]\n{"event": "save", "seconds": "slow"}\n')
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--health"]) in (0, 1)


@pytest.mark.parametrize("manifest", ["[1, 2]", '"x"', "null", '{"files": {}}', '{"files": [1]}', "{", "\ufeff{}"])
def test_verify_on_a_manifest_of_the_wrong_type_reports_damage(manifest: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    step = tmp_path / "step_000000001"
    step.mkdir()
    (step / "manifest.json").write_text(manifest)
    assert main(["verify", str(tmp_path)]) == 1
    assert "DAMAGED" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "match"), [(["--nodes", "0", "--", "true"], "--nodes='0'"),
                                             (["--nodes", "-1", "--", "true"], "--nodes='-1'"),
                                             (["missing.sbatch"], "no such batch script"),
                                             (["--", "/no/such/program"], "no such batch script or command"),
                                             (["--at", "3", "--", "true"], "--at SECONDS says when"),
                                             (["--grace", "-2", "--", "true"], "--grace -2")])
def test_sim_refuses_bad_usage_with_exit_2(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", *argv]) == 2
    assert match in capsys.readouterr().err


@FUZZ
@given(st.binary(max_size=400))
def test_status_and_doctor_on_random_bytes_never_raise(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    directory = tmp_path_factory.mktemp("events")
    (directory / "events-3.jsonl").write_bytes(data)
    assert main(["status", str(directory), "--no-chart"]) in (0, 1)
    doctor({}, ParallelConfig(), events_dirs=[directory])


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_verify_on_random_manifest_bytes_never_raises(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    step = tmp_path_factory.mktemp("ckpt") / "step_000000004"
    step.mkdir()
    (step / "manifest.json").write_bytes(data)
    assert main(["verify", str(step.parent)]) == 1


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["event", "time", "rank", "restart", "step", "seconds", "reasons", "outcome",
                                          "code", "name", "x"]), inner, max_size=6), max_leaves=12)


@FUZZ
@given(st.lists(_JSON, max_size=6))
def test_events_of_any_shape_are_read_or_skipped_and_status_never_raises(
        tmp_path_factory: pytest.TempPathFactory, events: list[Any]) -> None:
    directory = tmp_path_factory.mktemp("events")
    path = directory / "events-5.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    kept = list(read_events(path))
    assert all(malformed(e) is None for e in kept)
    assert main(["status", str(directory), "--no-chart"]) in (0, 1)


# -- every parser: a value, or its own error ------------------------------------------------------------------

_OPTION_NAMES = sorted({"checkpoint_dir", "kill_switch", "keep_last", "keep_every", "save_threads", "save_nice",
                        "save_process", "signals", "requeue", "max_restarts", "deadline", "deadline_margin_s",
                        "save_time_s",
                        "kill_wait_s", "kill_switch_poll_s", "watch_interval_s", "census_wait_s", "end_time_refresh_s",
                        "watchdog", "hang_timeout_s",
                        "hang_floor_s", "startup_timeout_s", "max_excluded_nodes", "max_futile_runs", "health_check",
                        "progress_s", "tp", "pp", "cp", "fsdp", "nnodes", "gpus_per_node"})


@FUZZ
@given(st.dictionaries(st.sampled_from(_OPTION_NAMES),
                       st.text(string.printable, max_size=8) | st.integers() | st.floats() | st.booleans(),
                       max_size=4))
def test_options_parse_to_options_or_a_config_error(values: dict[str, Any]) -> None:
    env = {f"SLURMRT_{k.upper()}": str(v) for k, v in values.items()}
    for source in ({"given": values, "env": {}}, {"given": {}, "env": env}):
        try:
            opts = Options.resolve(source["given"], source["env"])
        except ConfigError:
            continue
        assert opts.watch_interval_s >= 0.01 and opts.kill_wait_s >= 0 and opts.keep_last >= 1


_SLURM_NAMES = ["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NNODES",
                "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_RESTART_COUNT", "MASTER_PORT",
                "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_JOB_NUM_NODES"]


@FUZZ
@given(st.dictionaries(st.sampled_from(_SLURM_NAMES),
                       st.sampled_from(["0", "1", "2", "-1", "4", "70000", "abc", "", "n[1-2]", "2(x2)", "n1", "1.5",
                                        "٣", "n[3-1]", "3(x2),1"]), max_size=10))
def test_the_environment_gives_a_topology_or_a_config_error(env: dict[str, str]) -> None:
    try:
        topo = from_environ(env, hostname="n1")
    except ConfigError:
        return
    assert 0 <= topo.rank < topo.world_size and 1 <= topo.master_port <= 65535


@FUZZ
@given(st.text(alphabet="n0123456789[]-,abx.", max_size=20))
def test_a_hostlist_expands_or_gives_a_hostlist_error(expression: str) -> None:
    try:
        hosts = hostlist.expand(expression)
    except HostlistError:
        return
    assert all(isinstance(h, str) and h for h in hosts)


@FUZZ
@given(st.sampled_from(["nodes", "ntasks-per-node", "time", "signal", "open-mode"]),
       st.text(string.printable, max_size=10))
def test_a_sim_option_applies_or_gives_a_config_error(name: str, value: str) -> None:
    try:
        spec = apply_option(JobSpec(), name, value)
    except ConfigError as err:
        assert repr(value) in str(err)  # the value, named
        return
    assert spec.nodes >= 1 and spec.ntasks_per_node >= 1 and (spec.time_s is None or spec.time_s >= 0)


def test_the_old_name_of_the_watch_interval_still_works_and_says_it_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="kill_switch_poll_s is deprecated: use watch_interval_s"):
        assert Options.resolve({"kill_switch_poll_s": 0.5}, {}).watch_interval_s == 0.5
    with pytest.warns(DeprecationWarning, match="SLURMRT_KILL_SWITCH_POLL_S is deprecated"):
        assert Options.resolve({}, {"SLURMRT_KILL_SWITCH_POLL_S": "2"}).watch_interval_s == 2.0
    with pytest.warns(DeprecationWarning):  # the new name, given too, wins
        assert Options.resolve({"kill_switch_poll_s": 0.5, "watch_interval_s": 1}, {}).watch_interval_s == 1.0
    with pytest.warns(DeprecationWarning, match="use watch_interval_s"):
        assert Options(watch_interval_s=3.0).kill_switch_poll_s == 3.0
    assert "SLURMRT_KILL_SWITCH_POLL_S" not in unknown_variables({"SLURMRT_KILL_SWITCH_POLL_S": "2"})


@pytest.mark.parametrize(("name", "default"), [("max_futile_runs", 3), ("progress_s", 10.0), ("max_restarts", None)])
def test_none_is_a_value_of_its_own_not_the_default(name: str, default: object) -> None:
    assert getattr(Options.resolve({}, {}), name) == default
    assert getattr(Options.resolve({}, {f"SLURMRT_{name.upper()}": "none"}), name) is None
    assert getattr(Options.resolve({name: "never"}, {}), name) is None
