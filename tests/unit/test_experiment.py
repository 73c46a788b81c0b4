"""The experiment id, the tracker helpers and the job's timeline, without a job."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurmrt import ConfigError, trackers
from slurmrt.record.chart import draw, render, totals
from slurmrt.record.experiment import EXPERIMENT_FILE, establish
from slurmrt.record.timeline import build

# -- the experiment id ---------------------------------------------------------------------------------------------


def test_a_fresh_directory_gets_a_new_id_that_every_later_call_reads_back(tmp_path: Path) -> None:
    first = establish(tmp_path / "ckpt", job="4711_3")
    assert first.startswith("4711_3-") and establish(tmp_path / "ckpt", job="4800") == first
    assert establish(tmp_path / "other", job="4711_3") != first


def test_an_override_is_stored_in_a_fresh_directory_and_wins_over_a_stored_id(tmp_path: Path) -> None:
    assert establish(tmp_path / "a", job="1", override="gpt-7b") == "gpt-7b"
    assert establish(tmp_path / "a", job="2") == "gpt-7b"
    assert establish(tmp_path / "a", job="2", override="gpt-7b-v2") == "gpt-7b-v2"
    assert establish(tmp_path / "a", job="3") == "gpt-7b", "an override does not rewrite the stored id"


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "x" * 65, "-leading"])
def test_a_bad_override_is_a_clear_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="experiment id"):
        establish(tmp_path, job="1", override=bad)
    assert not (tmp_path / EXPERIMENT_FILE).exists()


def test_a_damaged_experiment_file_names_itself_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / EXPERIMENT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match=r"experiment\.json is unreadable.*fix or remove it"):
        establish(tmp_path, job="1")
    assert (tmp_path / EXPERIMENT_FILE).read_text() == "{not json", "nothing is overwritten"


def test_an_unwritable_checkpoint_directory_fails_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create"):
        establish(blocker / "ckpt", job="1")


# -- the tracker helpers -------------------------------------------------------------------------------------------


def _rt(tmp_path: Path, resumed: int | None, *, loaded: bool = True) -> Any:
    return SimpleNamespace(experiment_id="4711-abcd1234", resumed_step=resumed, loaded=loaded,
                           options=SimpleNamespace(checkpoint_dir=tmp_path))


def test_the_first_step_follows_the_checkpoint_and_needs_load_latest_first(tmp_path: Path) -> None:
    assert trackers.first_step(_rt(tmp_path, None)) == 0
    assert trackers.first_step(_rt(tmp_path, 99)) == 100
    with pytest.raises(ConfigError, match="before rt.load_latest"):
        trackers.first_step(_rt(tmp_path, None, loaded=False))
    assert trackers.first_step(_rt(tmp_path, None, loaded=False), resumed_step=41) == 42


def test_tensorboard_purges_from_the_first_step_the_resumed_run_logs(tmp_path: Path) -> None:
    assert trackers.tensorboard_purge_step(_rt(tmp_path, None)) is None
    assert trackers.tensorboard_purge_step(_rt(tmp_path, 99)) == 100


def test_wandb_resumes_the_experiments_run_and_rewinds_only_when_asked(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert trackers.wandb_args(_rt(tmp_path, 99)) == {"id": "4711-abcd1234", "resume": "allow"}
    assert trackers.wandb_args(_rt(tmp_path, None), rewind=True) == {"id": "4711-abcd1234", "resume": "allow"}
    monkeypatch.setattr(trackers, "_wandb_has_rewind", lambda: True)
    assert trackers.wandb_args(_rt(tmp_path, 99), rewind=True) == {"resume_from": "4711-abcd1234?_step=100"}
    monkeypatch.setattr(trackers, "_wandb_has_rewind", lambda: False)
    assert trackers.wandb_args(_rt(tmp_path, 99), rewind=True) == {"id": "4711-abcd1234", "resume": "allow"}
    assert "has no resume_from" in caplog.text


def test_the_installed_wandb_is_probed_for_rewind() -> None:
    wandb = pytest.importorskip("wandb")
    import inspect

    assert trackers._wandb_has_rewind() == ("resume_from" in inspect.signature(wandb.init).parameters)


# -- the timeline --------------------------------------------------------------------------------------------------


def _events() -> list[dict[str, Any]]:
    """Run 0 trains steps 0..15, saves step 9, and is killed; run 1 waits 30 s, resumes step 9 and finishes at 39."""
    def ev(t: float, restart: int, event: str, **kw: Any) -> dict[str, Any]:
        stamp = f"2026-11-21T10:{int(t) // 60:02d}:{t % 60:06.3f}+00:00"
        return {"time": stamp, "event": event, "job": "12", "restart": restart, "rank": 0, **kw}

    out = [ev(0, 0, "init", experiment="12-abcd1234"), ev(1, 0, "fresh_start")]
    out += [ev(2 + s, 0, "progress", step=s) for s in range(16)]
    out.append(ev(12.5, 0, "save", step=9, seconds=0.5))
    out += [ev(48, 1, "init", experiment="12-abcd1234"), ev(50, 1, "resume", step=9)]
    out += [ev(50 + s, 1, "progress", step=s) for s in range(10, 40)]
    out += [ev(95, 1, "save", step=29, seconds=1.5),  # a background save that committed ten steps late
            ev(90, 1, "save", step=39, seconds=1.0), ev(91, 1, "exit", outcome="FINISHED", code=0)]
    return sorted(out, key=lambda e: e["time"])


def test_lost_work_is_what_the_next_run_trained_again() -> None:
    life = build(_events())
    run0, run1 = life.runs
    assert (run0.last_step, run0.lost_steps, run0.outcome) == (15, 6, None)
    # from the commit of step 9 (12.5 s) to the run's last event (step 15 at 17 s)
    assert run0.lost_s == pytest.approx(4.5)
    assert run1.lost_steps == 0 and run1.resumed_from == 9 and run1.last_checkpoint == 39
    assert life.gaps == [pytest.approx(31.0)] and life.save_s == pytest.approx(3.0)
    assert [s for _, s in run1.points] == sorted({s for _, s in run1.points}), "the step never goes down"
    assert totals(life) == ("totals: 2 run(s), reached step 39 in 95.0 s; work lost 6 step(s) (4.5 s); waiting "
                            "between runs 31.0 s; saving 3.0 s (3 checkpoint(s))")


def test_the_text_timeline_marks_runs_checkpoints_lost_work_and_the_wait() -> None:
    lines = render(build(_events()), width=60, height=10)
    chart = "\n".join(lines)
    assert lines[0].startswith("39 |") and lines[9].startswith(" 0 |")
    assert all(mark in chart for mark in "01*!.-")
    top = lines[0]
    assert top.rstrip().endswith("*") or "1" in top, "the last step is drawn at the top"
    assert lines[-1].strip().startswith("0 s") and lines[-1].rstrip().endswith("95.0 s")


def test_the_picture_is_a_png_of_the_expected_size_and_not_blank(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    path = draw(build(_events()), tmp_path / "life.png")
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (500, 1000)
    rgb = pixels[..., :3].reshape(-1, 3)
    assert (rgb.min(axis=1) < 0.9).mean() > 0.02, "more than a blank canvas"
    assert len({tuple(p) for p in (rgb * 255).astype(int)[::7].tolist()}) > 20, "lines of several colours"
    svg = draw(build(_events()), tmp_path / "life.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_without_matplotlib_drawing_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'slurmrt\[plot\]'"):
        draw(build(_events()), tmp_path / "life.png")


def test_a_run_that_trained_past_its_last_checkpoint_is_recorded_where_it_really_ended() -> None:
    """The quickstart's pattern: periodic saves, none at the end. Run 0 saves step 35, trains on to 39 and is
    stopped for a requeue without a save (SIGTERM left no time); run 1 resumes from 35 and finishes at 49, its last
    checkpoint at 45. Only the exit events know 39 and 49 (progress was last sampled at 30 and 40)."""
    def ev(t: float, restart: int, event: str, **kw: Any) -> dict[str, Any]:
        return {"time": f"2026-11-21T10:00:{t:06.3f}+00:00", "event": event, "job": "12", "restart": restart,
                "rank": 0, **kw}

    events = [ev(0, 0, "init"), ev(1, 0, "fresh_start"), ev(2, 0, "progress", step=0), ev(5, 0, "progress", step=30),
              ev(6, 0, "save", step=35, seconds=0.1), ev(7, 0, "exit", outcome="REQUEUED", code=3, step=39),
              ev(20, 1, "init"), ev(21, 1, "resume", step=35), ev(22, 1, "progress", step=40),
              ev(23, 1, "save", step=45, seconds=0.1), ev(24, 1, "exit", outcome="FINISHED", code=0, step=49)]
    life = build(events)
    run0, run1 = life.runs
    assert (run0.last_step, run0.lost_steps, run0.lost_after) == (39, 4, 35)
    assert (run1.last_step, run1.lost_steps) == (49, 0), "a finished run's last steps are its result, not lost"
    assert run1.points[-1] == (pytest.approx(run1.end), 49), "the line ends where the run ended"
    assert totals(life).startswith("totals: 2 run(s), reached step 49 in 24.0 s; work lost 4 step(s)")
    unknown = [e for e in events if e["event"] != "exit"] + [ev(24, 1, "exit", outcome="FINISHED", step=None)]
    assert build(unknown).runs[1].last_step == 45, "an exit without a step leaves the steps the others name"
