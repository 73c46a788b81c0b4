"""The goodput ledger: every second of a job in one category, from an event log with known times."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurmrt.cli import main
from slurmrt.record.goodput import CATEGORIES, account

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def ev(t: float, restart: int, event: str, **kw: object) -> dict[str, object]:
    return {"time": (T0 + timedelta(seconds=t)).isoformat(), "event": event, "job": "12", "restart": restart,
            "rank": 0, **kw}


EVENTS = [
    # run 0: 10 s to start, a 2 s blocking save, then rank 1 stops answering at 160 s (found at 200 s, idle 40 s),
    # and the run ends HUNG at 230 s: 60 s of steps after the kept checkpoint (100 s) are lost
    ev(0, 0, "init", nnodes=2, job_nodes=3), ev(10, 0, "fresh_start", seconds=0.0),
    ev(100, 0, "save", step=99, seconds=2.0, blocking=True), ev(150, 0, "progress", step=150),
    ev(200, 0, "hang", step=150, idle_s=40.0), ev(230, 0, "exit", outcome="HUNG", code=5, step=150),
    # 60 s in the queue; run 1: 30 s to start, 5 s of it the load; it stops at 600 s, saves for 8 s, ends at 620 s
    ev(290, 1, "init", nnodes=2, job_nodes=3), ev(320, 1, "resume", step=99, seconds=5.0),
    ev(500, 1, "progress", step=300), ev(600, 1, "decision", step=350, reasons=["signal"]),
    ev(610, 1, "save", step=350, seconds=8.0, blocking=True), ev(620, 1, "exit", outcome="FINISHED", step=350),
]


def test_each_second_falls_in_one_category_and_they_add_up_to_the_wall_time() -> None:
    ledger = account(EVENTS)
    assert ledger.seconds == pytest.approx({
        "productive": 88.0 + 280.0, "process_start": 0.0, "startup": 10.0 + 25.0, "load": 5.0,
        "checkpoint_stall": 2.0 + 8.0, "lost_work": 60.0, "health_rerun": 0.0, "health_rewind": 0.0,
        "recovery": 70.0, "stopping": 12.0, "waiting": 60.0})
    assert list(ledger.seconds) == list(CATEGORIES)
    assert ledger.wall_s == pytest.approx(620.0, rel=0.01)  # the first run's start to the last run's end
    assert ledger.ettr == pytest.approx(368.0 / 620.0)
    # node-hours: 2 nodes trained of the 3 the allocation held, while each run held them
    assert ledger.node_goodput == pytest.approx((88.0 * 2 + 280.0 * 2) / (230.0 * 3 + 330.0 * 3))


def test_a_log_without_node_counts_has_no_node_goodput_and_an_empty_one_no_ratio() -> None:
    stripped = [{k: v for k, v in e.items() if k not in ("nnodes", "job_nodes")} for e in EVENTS]
    assert account(stripped).node_goodput is None and account(stripped).ettr == pytest.approx(368.0 / 620.0)
    assert account([]).ettr is None and account([]).lines() == ["goodput: no time recorded"]


def test_status_prints_the_ledger_and_json_carries_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    assert main(["status", str(tmp_path), "--no-chart"]) == 0
    text = capsys.readouterr().out
    assert "goodput: 59.4% of 10m20s was productive (effective training time ratio); 43.8% of the node-hours" in text
    assert "fault detection and recovery 70.0 s (11.3%)" in text and "waiting between runs 60.0 s (9.7%)" in text
    assert main(["status", str(tmp_path), "--json"]) == 0
    goodput = json.loads(capsys.readouterr().out)["jobs"][0]["goodput"]
    assert goodput["ettr"] == pytest.approx(368.0 / 620.0) and goodput["seconds"]["lost_work"] == pytest.approx(60)
    assert [r["label"] for r in goodput["runs"]] == ["0", "1"]


def test_the_metrics_file_is_openmetrics_text_replaced_whole(tmp_path: Path) -> None:
    from slurmrt.record.goodput import openmetrics, write_metrics

    text = openmetrics(account(EVENTS), job="12", experiment='e"1')
    assert text.endswith("# EOF\n")
    assert 'slurmrt_goodput_ratio{job="12",experiment="e\\"1"} 0.593548' in text
    assert 'slurmrt_time_seconds{job="12",experiment="e\\"1",category="recovery"} 70.000' in text
    log = tmp_path / "events-12.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    target = tmp_path / "slurmrt.prom"
    target.write_text("old")
    write_metrics(target, log, job="12", experiment=None)
    assert target.read_text().startswith("# HELP slurmrt_goodput_ratio") and 'category="waiting"} 60.000' in \
        target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events-12.jsonl", "slurmrt.prom"]  # no temporary left


def test_the_tracker_metrics_are_the_ledger_flattened(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from slurmrt import trackers

    log = tmp_path / "events-12.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    metrics = trackers.goodput_metrics(SimpleNamespace(event_log=log))
    assert metrics["slurmrt/goodput"] == pytest.approx(368.0 / 620.0, abs=1e-6)
    assert metrics["slurmrt/seconds/recovery"] == 70.0 and metrics["slurmrt/seconds/waiting"] == 60.0
    assert "slurmrt/node_goodput" in metrics and len(metrics) == len(CATEGORIES) + 2
    assert trackers.goodput_metrics(SimpleNamespace(event_log=None)) == {}
    assert trackers.goodput_metrics(SimpleNamespace(event_log=tmp_path / "none.jsonl")) == {}


def test_a_run_killed_before_its_init_event_counts_the_nodes_of_the_run_before() -> None:
    # run 1 wrote no init (killed during its start-up); only `slurmrt run`'s exit event for it remains
    events = [*EVENTS[:6], ev(250, 1, "exit", outcome="HUNG", code=5, lead=True),
              *[{**e, "restart": 2} for e in EVENTS[6:]]]
    ledger = account(events)
    assert [r.nodes for r in ledger.runs] == [2, 2, 2] and [r.job_nodes for r in ledger.runs] == [3, 3, 3]
    assert ledger.node_goodput is not None


def test_a_run_that_ended_in_its_start_up_neither_loses_work_nor_decides_what_was_kept() -> None:
    # run 0 trains to step 300 and finishes its work; its node fails as it exits, so Slurm requeues the job: run 1
    # dies in its start-up (no load), run 2 resumes after step 300 and finishes at once. Nothing of run 0 was lost.
    events = [ev(0, 0, "init", nnodes=2), ev(10, 0, "fresh_start", seconds=0.0), ev(100, 0, "progress", step=200),
              ev(150, 0, "save", step=300, seconds=1.0, blocking=True),
              ev(152, 0, "exit", outcome="FINISHED", step=300),
              ev(160, 1, "init", nnodes=2), ev(170, 1, "hang", step=None, idle_s=5.0),
              ev(175, 1, "exit", outcome="HUNG", code=5),
              ev(180, 2, "init", nnodes=2), ev(190, 2, "resume", step=300, seconds=1.0),
              ev(191, 2, "exit", outcome="FINISHED", step=300)]
    ledger = account(events)
    assert ledger.seconds["lost_work"] == 0.0
    assert ledger.wall_s == pytest.approx(191.0) and sum(ledger.seconds.values()) == pytest.approx(191.0)
    # run 0's 152 s less its start-up (10), its save (1) and its end (1); run 1, never loaded, trained nothing
    assert ledger.seconds["productive"] == pytest.approx(140.0)
    assert [r.seconds["productive"] for r in ledger.runs[1:]] == [0.0, 0.0]


def test_the_metrics_file_parses_with_prometheus_own_parsers(tmp_path: Path) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families as text_families

    from slurmrt.record.goodput import write_metrics

    log = tmp_path / "events-12.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    target = tmp_path / "run.prom"
    write_metrics(target, log, job="12", experiment="e-1")
    text = target.read_text()
    for parse in (openmetrics_families, text_families):  # the OpenMetrics parser is strict: # EOF, units, names
        samples = {(s.name, s.labels.get("category")): s.value for f in parse(text) for s in f.samples}
        assert samples[("slurmrt_goodput_ratio", None)] == pytest.approx(368.0 / 620.0, abs=1e-6)
        assert samples[("slurmrt_time_seconds", "lost_work")] == pytest.approx(60.0)
        assert sum(v for (name, c), v in samples.items() if name == "slurmrt_time_seconds") == pytest.approx(620.0)


def test_a_run_that_never_loads_a_checkpoint_is_productive_from_its_first_step() -> None:
    """No load_latest() (no checkpoint directory, or a script that only saves): start-up ends at the first step,
    not at a load that never comes (which counted the whole run as start-up, 0 % productive)."""
    events = [ev(0, 0, "init", nnodes=1), ev(4, 0, "progress", step=0), ev(50, 0, "progress", step=90),
              ev(60, 0, "exit", outcome="FINISHED")]
    ledger = account(events)
    assert ledger.seconds["startup"] == pytest.approx(4.0)
    assert ledger.seconds["productive"] == pytest.approx(46.0)
    assert ledger.seconds["stopping"] == pytest.approx(10.0)  # from its last step event to its end


def test_the_time_before_init_is_process_start_not_waiting_and_no_second_counts_twice() -> None:
    """Each init event says how long its process ran before it (interpreter, imports): the job's wall time starts
    that much earlier, and the wait before a run is that much shorter. A process start that would reach back into
    the run before (two hosts' clocks) is cut at that run's end."""
    events = [{**e, "process_s": 3.0} if e["event"] == "init" and e["restart"] == 0 else
              {**e, "process_s": 5.0} if e["event"] == "init" else e for e in EVENTS]
    ledger = account(events)
    assert ledger.seconds["process_start"] == pytest.approx(8.0)
    assert ledger.seconds["waiting"] == pytest.approx(55.0) and ledger.seconds["startup"] == pytest.approx(35.0)
    assert ledger.wall_s == pytest.approx(623.0) and sum(ledger.seconds.values()) == pytest.approx(623.0)
    events = [{**e, "process_s": 100.0} if e["event"] == "init" and e["restart"] == 1 else e for e in EVENTS]
    ledger = account(events)
    assert ledger.seconds["process_start"] == pytest.approx(60.0) and ledger.seconds["waiting"] == 0.0
    assert ledger.wall_s == pytest.approx(620.0)



def test_the_wall_time_starts_when_slurm_started_the_run_as_rank_0_reported_it() -> None:
    """Rank 0's first progress report carries Slurm's start of the run (squeue's %S, SLURM_JOB_START_TIME): the
    batch script, the launcher and the process before init() are process start, and the wall time starts there."""
    start0, start1 = (T0 - timedelta(seconds=20)).timestamp(), (T0 + timedelta(seconds=280)).timestamp()
    said = [{**e, "slurm_start": start0} if e["event"] == "progress" and e["restart"] == 0 else
            {**e, "slurm_start": start1} if e["event"] == "progress" else e for e in EVENTS]
    ledger = account(said)
    assert ledger.seconds["process_start"] == pytest.approx(20.0 + 10.0)
    assert ledger.wall_s == pytest.approx(640.0) and ledger.seconds["waiting"] == pytest.approx(50.0)
    assert sum(ledger.seconds.values()) == pytest.approx(640.0)
    # an init's own measure wins where it is longer; a start a day and more before init, or after it, is not believed
    longer = [{**e, "process_s": 25.0} if e["event"] == "init" and e["restart"] == 0 else e for e in said]
    assert account(longer).seconds["process_start"] == pytest.approx(25.0 + 10.0)
    for bad in ((T0 - timedelta(days=2)).timestamp(), (T0 + timedelta(seconds=5)).timestamp(), "soon", 1e300, -1.0):
        damaged = [{**e, "slurm_start": bad} if e["event"] == "progress" else e for e in EVENTS]
        assert account(damaged).wall_s == pytest.approx(620.0)
    # an in-job restart's step is not the run's start: Slurm's start belongs to the run's first step
    later = [{**e, "attempt": 1} for e in said]
    assert account(later).seconds["process_start"] == 0.0

def test_the_totals_and_the_ledger_give_one_account_of_the_work_lost() -> None:
    """A run cut short loses the steps from its kept checkpoint to its fault (the hang less its idle time); from
    there to its end is recovery. `slurmrt status`'s totals line and the ledger count the same seconds."""
    from slurmrt.record.timeline import build

    life = build(EVENTS)
    assert life.lost_s == pytest.approx(account(EVENTS).seconds["lost_work"]) == pytest.approx(60.0)
    assert life.runs[0].fault_at is not None and life.runs[1].fault_at is None


def test_a_blocking_save_after_the_kept_checkpoint_is_stall_not_lost_work() -> None:
    """Run 0 saves again at step 150 (a 20 s blocking save, 130-150 s) after the checkpoint run 1 resumes from (99):
    its files went with the node. Those 20 s held training: checkpoint stall, and not lost work as well."""
    from slurmrt.record.timeline import build

    events = [*EVENTS[:3], ev(150, 0, "save", step=150, seconds=20.0, blocking=True), *EVENTS[3:]]
    ledger = account(events)
    assert ledger.seconds["checkpoint_stall"] == pytest.approx(2.0 + 20.0 + 8.0)
    assert ledger.seconds["lost_work"] == pytest.approx(60.0 - 20.0)  # 100 s to the fault at 160 s, less the save
    assert build(events).lost_s == pytest.approx(ledger.seconds["lost_work"])  # the totals say the same
    assert sum(ledger.seconds.values()) == pytest.approx(ledger.wall_s) == pytest.approx(620.0)


def test_a_frozen_rank_0s_hang_is_recovery_whether_or_not_a_background_save_was_in_flight() -> None:
    """Rank 0 is frozen (SIGSTOP) at 150 s, in step 151; rank 1 finds the hang at 190 s (idle 40 s) and leads the
    answer; rank 0 wakes at 260 s, where it says its step and commits the background save it had begun at step 149
    (started 149 s). The frozen 110 s are the hang's (recovery), not work kept, and not lost work: the same
    account whichever policy had a save in flight, from the save's start and rank 1's hang."""
    from slurmrt.record.timeline import build

    def frozen(save: bool, started: bool = True) -> list[dict[str, object]]:
        return [
            ev(0, 0, "init", nnodes=2, job_nodes=3), ev(10, 0, "fresh_start", seconds=0.0),
            ev(100, 0, "save", step=99, seconds=2.0, blocking=True), ev(149, 0, "progress", step=149),
            {**ev(190, 0, "hang", step=151, idle_s=40.0, activity="step"), "rank": 1},
            {**ev(250, 0, "exit", outcome="HUNG", code=5, step=151, lead=True), "rank": 1},
            ev(260, 0, "progress", step=151),
            *([ev(260.1, 0, "save", step=149, seconds=0.1, blocking=False, **({"started": (T0.timestamp() + 149)}
                                                                              if started else {}))] if save else []),
            ev(260.2, 0, "hang", step=151, activity="lost_peer"), ev(261, 0, "exit", outcome="HUNG", code=5),
            ev(300, 1, "init", nnodes=2, job_nodes=3), ev(310, 1, "resume", step=149 if save else 99, seconds=1.0),
            ev(400, 1, "progress", step=400), ev(410, 1, "exit", outcome="FINISHED", step=400),
        ]

    without, within = account(frozen(save=False)).seconds, account(frozen(save=True)).seconds
    assert build(frozen(save=False)).runs[0].fault_at == pytest.approx(T0.timestamp() + 150)  # rank 1's wait began
    assert without["recovery"] == pytest.approx(within["recovery"]) == pytest.approx(261 - 150)
    assert without["lost_work"] == pytest.approx(150 - 100)  # from the kept checkpoint (99) to the fault
    assert within["lost_work"] == pytest.approx(150 - 149)  # from the save's start: the commit came after the wake
    assert within["productive"] == pytest.approx(without["productive"] + 49)  # the steps the save kept, no more
    # a log from before the save said when it began: its commit, after the fault, keeps everything to the fault
    assert account(frozen(save=True, started=False)).seconds["recovery"] == pytest.approx(261 - 150)


def test_a_background_saves_stall_is_checkpoint_stall_and_its_write_behind_the_training_is_not() -> None:
    """Run 1 makes a background save at 400 s: its call holds the training 3 s (the copy to host memory, the wait for
    the save before it), then the write goes on behind the training for 40 s and commits at 443 s. The 3 s are
    checkpoint stall, as a blocking save's are; the 40 s of the write are not. A log from before saves said their
    stall counts a background save's as before, as nothing."""
    save = ev(443, 1, "save", step=250, seconds=40.0, blocking=False, started=T0.timestamp() + 400)
    ledger = account([*EVENTS[:8], {**save, "stall": 3.0}, *EVENTS[8:]]).seconds
    assert ledger["checkpoint_stall"] == pytest.approx(2.0 + 3.0 + 8.0)
    assert account([*EVENTS[:8], save, *EVENTS[8:]]).seconds["checkpoint_stall"] == pytest.approx(2.0 + 8.0)
    # a stall said longer than the time from the save's call to its commit ends at the commit
    said = account([*EVENTS[:8], {**save, "stall": 90.0}, *EVENTS[8:]]).seconds["checkpoint_stall"]
    assert said == pytest.approx(2.0 + 43.0 + 8.0)


def test_badput_that_would_exceed_its_run_is_cut_to_the_run() -> None:
    """Records that overlap (a blocking save said to take longer than its run had lasted, two at once) must not
    count a second twice: each category stays within the run, productive never below zero, the sum the wall."""
    events = [*EVENTS[:3], ev(140, 0, "save", step=140, seconds=1e6, blocking=True),
              ev(145, 0, "save", step=145, seconds=140.0, blocking=True), *EVENTS[3:]]
    ledger = account(events)
    run0 = ledger.runs[0].seconds
    assert all(v >= 0.0 for v in run0.values()) and sum(run0.values()) == pytest.approx(230.0)
    assert run0["productive"] == 0.0
    assert sum(ledger.seconds.values()) == pytest.approx(ledger.wall_s) == pytest.approx(620.0)
    assert ledger.runs[1].seconds == account(EVENTS).runs[1].seconds  # the other run untouched


def test_an_in_process_restart_counts_its_fault_to_the_reload_as_recovery_and_the_steps_since_a_save_as_lost() -> None:
    fault = (T0 + timedelta(seconds=50)).timestamp()
    events = [  # one run: fresh start at 10 s, a save at 40 s, rank 1 raises at 50 s, all back and reloaded at 53 s
        ev(0, 0, "init", nnodes=2, job_nodes=2), ev(10, 0, "fresh_start", seconds=0.0),
        ev(40, 0, "save", step=30, seconds=1.0, blocking=True),
        ev(51, 0, "in_process", generation=0, action="restart", first_rank=1, error="RuntimeError: boom", step=39,
           fault_time=fault, seconds=1.0),
        ev(53, 0, "resume", step=30, seconds=1.5), ev(100, 0, "progress", step=90),
        ev(100, 0, "exit", outcome="FINISHED", step=90)]
    ledger = account(events)
    assert ledger.seconds == pytest.approx({
        "productive": 100 - 10 - 1 - 10 - 3, "process_start": 0.0, "startup": 10.0, "load": 0.0,
        "checkpoint_stall": 1.0, "lost_work": 10.0, "health_rerun": 0.0, "health_rewind": 0.0,
        "recovery": 3.0, "stopping": 0.0, "waiting": 0.0})
    # a refused restart ends nothing by itself: the run's end says how it ended
    refused = [{**e, "action": "refused", "why": "max_restarts"} if e["event"] == "in_process" else e for e in events]
    assert account(refused).seconds["recovery"] == 0.0


def test_slurmrt_status_says_each_in_process_restart_in_the_run_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fault = (T0 + timedelta(seconds=50)).timestamp()
    events = [ev(0, 0, "init", nnodes=2), ev(10, 0, "fresh_start", seconds=0.0),
              ev(51, 0, "in_process", generation=0, action="restart", first_rank=1, error="RuntimeError: boom",
                 step=39, fault_time=fault, seconds=0.25),
              ev(53, 0, "resume", step=30, seconds=1.5), ev(100, 0, "exit", outcome="FINISHED", step=90)]
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["status", "--no-chart", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 in-process restart(s)" in out
    assert "run 0: fresh start;" in out  # the run's first load, not the reload after the restart
    assert "in-process restart(s): rank 1's RuntimeError after step 39, every rank back in 0.25 s" in out


def test_an_in_process_restart_is_counted_once_the_same_way_by_every_record(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The status header, its totals, ``--json``, the goodput ledger, the saving advice's failure count and the
    simulator's summary read one count (slurmrt.record.inprocess): one restart, 9 steps trained again (39 back to
    the checkpoint of step 30), 10 s of them."""
    from slurmrt.sim.summary import RunRecord, _annotate, summary

    fault = (T0 + timedelta(seconds=50)).timestamp()
    events = [ev(0, 0, "init", nnodes=2, job_nodes=2), ev(10, 0, "fresh_start", seconds=0.0),
              ev(40, 0, "save", step=30, seconds=1.0, blocking=True),
              ev(51, 0, "in_process", generation=0, action="restart", first_rank=1, error="RuntimeError: boom",
                 step=39, fault_time=fault, seconds=1.0),
              ev(53, 0, "resume", step=30, seconds=1.5), ev(100, 0, "progress", step=90),
              ev(100, 0, "exit", outcome="FINISHED", step=90)]
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["status", "--no-chart", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 in-process restart(s)" in out and "work lost 9 step(s) (10.0 s)" in out, out
    assert "trained again after in-process restart(s) (9 step(s))" in out, out
    assert main(["status", "--json", str(tmp_path)]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["in_process_restarts"] == 1 and job["totals"]["lost_steps"] == 9
    assert job["totals"]["lost_s"] == pytest.approx(10.0) == job["goodput"]["seconds"]["lost_work"]
    assert job["saving"]["failures"] == 1  # the fault the run lived through is a failure to the cadence too
    record = RunRecord(restart=0)
    _annotate([record], events)
    assert record.in_process == 1 and "1 in-process restart(s)" in summary([record])


def test_work_redone_after_an_in_process_restart_counts_from_the_first_load_not_from_the_start_up() -> None:
    """No save before the fault: the steps trained again began at the run's first load (10 s), not at its init
    (0 s): the start-up is the ledger's start-up, never lost work as well."""
    fault = (T0 + timedelta(seconds=50)).timestamp()
    events = [ev(0, 0, "init", nnodes=2, job_nodes=2), ev(10, 0, "fresh_start", seconds=0.0),
              ev(51, 0, "in_process", generation=0, action="restart", first_rank=1, error="RuntimeError: boom",
                 step=39, fault_time=fault, seconds=1.0),
              ev(53, 0, "fresh_start", seconds=0.5), ev(100, 0, "progress", step=90),
              ev(100, 0, "exit", outcome="FINISHED", step=90)]
    ledger = account(events)
    assert ledger.seconds["lost_work"] == pytest.approx(40.0) and ledger.seconds["startup"] == pytest.approx(10.0)
    assert sum(ledger.seconds.values()) == pytest.approx(ledger.wall_s)


def _recovered(kind: str) -> list[dict[str, object]]:
    """A job that trains to step 39 after a checkpoint at 30, fails, comes back from 30 and finishes at 90: the
    failure answered by a restart in the process, a new step in the job (``slurmrt run``) or a requeue."""
    first = [ev(0, 0, "init", nnodes=2, job_nodes=2), ev(10, 0, "fresh_start", seconds=0.0),
             ev(40, 0, "save", step=30, seconds=1.0, blocking=True), ev(50, 0, "progress", step=39)]
    if kind == "in_process":
        fault = (T0 + timedelta(seconds=50)).timestamp()
        return [*first, ev(51, 0, "in_process", generation=0, action="restart", first_rank=1,
                           error="RuntimeError: boom", step=39, fault_time=fault, seconds=1.0),
                ev(53, 0, "resume", step=30, seconds=1.5), ev(100, 0, "progress", step=90),
                ev(100, 0, "exit", outcome="FINISHED", code=0, step=90)]
    if kind == "in_job":
        return [*first, ev(51, 0, "in_job_restart", nodes=["n2"], why="a new step", next_attempt=1, lead=True),
                ev(51, 0, "exit", outcome="PEER_LOST", code=5, step=39, action="in_job_restart", lead=True),
                ev(55, 0, "init", nnodes=2, job_nodes=3, attempt=1), ev(57, 0, "resume", step=30, attempt=1),
                ev(100, 0, "progress", step=90, attempt=1), ev(100, 0, "exit", outcome="FINISHED", code=0, step=90,
                                                                attempt=1)]
    return [*first, ev(51, 0, "exit", outcome="PEER_LOST", code=5, step=39, action="requeue", lead=True),
            ev(51, 0, "requeue", done=True, message="requeued", restart_count=0, lead=True),
            ev(70, 1, "init", nnodes=2, job_nodes=2), ev(72, 1, "resume", step=30),
            ev(120, 1, "progress", step=90), ev(120, 1, "exit", outcome="FINISHED", code=0, step=90)]


@pytest.mark.parametrize(("kind", "counts"), [("in_process", (0, 0, 1)), ("in_job", (0, 1, 0)),
                                              ("requeue", (1, 0, 0))])
def test_each_kind_of_recovery_is_counted_once_the_same_way_by_the_four_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, counts: tuple[int, int, int]) -> None:
    """A restart in the process, a new step and a requeue: `slurmrt status`'s header, `--json`, the simulator's
    summary count it once each (requeues, in-job restarts, in-process restarts), and the header's lost work, the
    json totals and the goodput ledger's lost work agree: the 9 steps from the checkpoint (30) to the fault (39)."""
    from slurmrt.sim.summary import RunRecord, _annotate, summary

    events = _recovered(kind)
    (tmp_path / "events-12.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    requeues, in_job, in_process = counts
    assert main(["status", "--no-chart", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    said = f"{requeues} requeue(s), {in_job} in-job restart(s)" + (f", {in_process} in-process restart(s)"
                                                                   if in_process else "")
    assert said in out and "work lost 9 step(s)" in out, out
    assert main(["status", "--json", str(tmp_path)]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert (job["restarts"], job["in_job_restarts"], job["in_process_restarts"]) == counts
    assert job["totals"]["lost_steps"] == 9 and job["totals"]["lost_s"] > 0
    assert job["totals"]["lost_s"] == pytest.approx(job["goodput"]["seconds"]["lost_work"])
    assert account(events).seconds["lost_work"] == pytest.approx(job["totals"]["lost_s"])
    records = [RunRecord(restart=r) for r in range(requeues + 1)]
    _annotate(records, events)
    assert said in summary(records)


def test_a_re_run_and_a_rewind_after_unhealthy_steps_are_their_own_categories_and_count_the_skipped_steps() -> None:
    from slurmrt.record.timeline import build

    def restart(at: int, fault_s: int) -> dict[str, object]:
        when = (T0 + timedelta(seconds=fault_s)).timestamp()
        return ev(at, 0, "in_process", generation=0, action="restart", first_rank=1,
                  error="TrainingHealthError: step 39", step=38, fault_time=when, seconds=1.0)

    events = [  # a NaN at step 39 (50 s), re-run from step 30 (back at 53 s); again at 70 s, rewound to step 10
        ev(0, 0, "init", nnodes=2, job_nodes=2), ev(10, 0, "fresh_start", seconds=0.0),
        ev(40, 0, "save", step=30, seconds=1.0, blocking=True),
        ev(50, 0, "training_health", step=39, what="nonfinite", first_rank=1, action="rerun", certified=None),
        restart(51, 50), ev(53, 0, "resume", step=30, seconds=1.5),
        ev(70, 0, "training_health", step=39, what="nonfinite", first_rank=1, action="rewind", certified=10),
        restart(71, 70), ev(74, 0, "resume", step=10, seconds=1.5), ev(120, 0, "progress", step=90),
        ev(120, 0, "exit", outcome="FINISHED", step=90)]
    seconds = account(events).seconds
    # each: back to its load, and the work since the newest save before its fault (the save at 40 s), as for any
    # restart in the process: the re-run 3 + 10 s, the rewind 4 + 30 s
    assert (seconds["health_rerun"], seconds["health_rewind"]) == pytest.approx((3.0 + 10.0, 4.0 + 30.0))
    assert seconds["recovery"] == 0.0 and seconds["lost_work"] == 0.0
    assert build(events, job="1").runs[0].in_process_cost.skipped_steps == 29
