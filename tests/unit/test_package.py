from __future__ import annotations

import pickle

import pytest

import slurmrt
from slurmrt import ConfigError, HostlistError, NodeCountError, SlurmrtError


def test_all_is_sorted_and_complete() -> None:
    assert slurmrt.__all__ == sorted(slurmrt.__all__)
    assert all(hasattr(slurmrt, name) for name in slurmrt.__all__)


def test_errors_subclass_the_builtin_they_mean_and_survive_pickling() -> None:
    err = NodeCountError("NNODES=4 but ...", declared=4, actual=2)
    assert isinstance(err, ConfigError) and isinstance(err, ValueError) and isinstance(err, SlurmrtError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is NodeCountError and str(back) == str(err) and back.details == {"declared": 4, "actual": 2}
    assert issubclass(HostlistError, ConfigError)


def test_unknown_init_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unknown options \\['chekpoint_dir'\\]"):
        slurmrt.init(chekpoint_dir="x")


def test_bad_option_value_from_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMRT_KEEP_LAST", "many")
    with pytest.raises(ConfigError, match="option keep_last='many' is invalid"):
        slurmrt.init()


def test_init_takes_an_options_object_and_overrides_and_they_win_over_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    for key in [k for k in __import__("os").environ if k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURMRT_KEEP_LAST", "7")
    monkeypatch.setenv("SLURMRT_SAVE_THREADS", "2")
    rt = slurmrt.init(slurmrt.Options(keep_last=5, deadline=False), keep_every=10)
    try:
        assert (rt.options.keep_last, rt.options.keep_every, rt.options.save_threads) == (5, 10, 2)
        assert rt.options.deadline is False
    finally:
        rt.close()


def test_log_is_exported_with_the_handler_the_readme_installs() -> None:
    assert slurmrt.log.install is not None and slurmrt.log.FlockHandler is slurmrt.FlockHandler


def test_the_log_prefix_is_computed_once_and_again_after_init_exports_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmrt import log

    monkeypatch.setattr(log, "_own_prefix", None)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert log._prefix() == "[n7:3]"
    monkeypatch.setenv("RANK", "5")
    assert log._prefix() == "[n7:3]", "cached: no lookups per line"
    log.forget_prefix()  # what init() does once it exported RANK
    assert log._prefix() == "[n7:5]"
    assert log._prefix({"SLURMD_NODENAME": "x", "RANK": "1"}) == "[x:1]", "another environment is never cached"
    assert log._prefix() == "[n7:5]"
