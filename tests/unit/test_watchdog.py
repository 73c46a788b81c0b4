"""The hang watchdog's allowances, on a fake clock; the census's suspects; the exclusions' limits; the loop guard."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from typing import Any

import pytest

from slurmrt import _clock
from slurmrt.hang.census import RankState, name_suspects
from slurmrt.hang.watchdog import STEP_FACTOR, Hang, Watchdog
from slurmrt.record.runs import Run
from slurmrt.recovery import exclusion
from slurmrt.recovery import policy as outcome
from slurmrt.recovery.settings import RecoverySection
from slurmrt.stop.deadline import Budget
from slurmrt.stop.state import Activity, PhaseTimes


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [1000.0]
    monkeypatch.setattr(_clock, "mono", lambda: t[0])
    return t


class Loop:
    """A training thread as the watchdog sees it: a heartbeat and an activity."""

    def __init__(self, now: list[float], *, floor_s: float = 180.0, startup_s: float = 1200.0,
                 fixed_s: float | None = None, save_s: float = 30.0) -> None:
        self.now = now
        self.budget = Budget(margin_s=30, save_time_s=save_s, kill_wait_s=30)
        self.phases = PhaseTimes()
        self.beat = now[0]
        self.activity: Activity | None = Activity("start", now[0])
        self.hangs: list[Hang] = []
        self.probes: list[float] = []
        self.dog = Watchdog(self.budget, self.phases, heartbeat=lambda: self.beat, activity=lambda: self.activity,
                            on_hang=self.hangs.append, floor_s=floor_s, startup_s=startup_s, fixed_s=fixed_s,
                            probe=self.probes.append)

    def steps(self, n: int, seconds: float) -> None:
        if self.activity is None or self.activity.kind != "step":
            self.activity = Activity("step", self.now[0])
        for _ in range(n):
            self.now[0] += seconds
            self.budget.steps.add(seconds)
            self.beat = self.now[0]
            self.dog.poll()

    def idle(self, seconds: float, *, polls: int = 10) -> None:
        for _ in range(polls):
            self.now[0] += seconds / polls
            self.dog.poll()


def test_a_step_hang_is_found_at_ten_times_the_slowest_recent_step_but_not_before_the_floor(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0)
    loop.steps(20, 0.5)
    loop.steps(1, 0.8)  # the slowest recent step
    assert loop.dog.allowance(Activity("step", now[0])) == pytest.approx(STEP_FACTOR * 0.8)
    loop.idle(7.9)
    assert loop.hangs == []
    loop.idle(0.2, polls=1)
    assert len(loop.hangs) == 1 and loop.hangs[0].allowed_s == pytest.approx(8.0)
    assert loop.hangs[0].activity.kind == "step"

    fast = Loop(now)
    fast.steps(50, 0.2)
    assert fast.dog.allowance(Activity("step", now[0])) == 180.0, "the floor: sub-second steps get 3 minutes"


def test_overdue_says_what_the_next_poll_would_find_without_firing(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0)
    loop.steps(20, 0.5)
    now[0] += 4.9
    assert not loop.dog.overdue()
    now[0] += 0.2  # past 10 x 0.5 s, and no poll since
    assert loop.dog.overdue() and loop.hangs == [], "asking fires nothing: the poll answers the hang"
    loop.activity = None  # the run closed
    assert not loop.dog.overdue()


def test_with_steps_under_a_second_the_default_finds_a_hang_within_five_minutes(now: list[float]) -> None:
    loop = Loop(now)  # the defaults
    loop.steps(100, 0.9)
    loop.idle(300, polls=60)  # the watcher polls every 5 s
    assert loop.hangs and loop.hangs[0].idle_s <= 185


def test_the_start_and_the_warm_up_steps_get_the_startup_allowance(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0, startup_s=600.0)
    loop.idle(599)
    assert loop.hangs == []
    loop.steps(3, 0.1)  # the first two are skipped by the estimator: one step measured, still warming up
    assert loop.dog.allowance(Activity("step", now[0])) == 600.0
    loop.idle(601)
    assert len(loop.hangs) == 1


def test_a_save_gets_five_times_the_slowest_measured_save(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0, save_s=30.0)
    loop.steps(20, 0.1)
    loop.budget.save_done(4.0, started=0.0, periodic=True)
    loop.activity = Activity("save", now[0])
    loop.idle(19.5)
    assert loop.hangs == [], "a save is not a step: 10 x 0.1 s would have fired long ago"
    loop.idle(1.0)
    assert len(loop.hangs) == 1 and loop.hangs[0].activity.kind == "save"


def test_a_phase_gets_three_times_its_longest_measured_duration_or_its_own_timeout(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0, startup_s=100.0)
    loop.steps(20, 0.1)
    loop.activity = Activity("phase", now[0], "eval")
    assert loop.dog.allowance(loop.activity) == 100.0, "never measured: the startup allowance"
    loop.phases.add("eval", 40.0)
    loop.phases.add("eval", 30.0)
    assert loop.dog.allowance(loop.activity) == 120.0
    assert loop.dog.allowance(Activity("phase", now[0], "eval", timeout_s=7.0)) == 7.0
    loop.idle(119)
    assert loop.hangs == []


def test_a_fixed_timeout_replaces_the_learned_one(now: list[float]) -> None:
    loop = Loop(now, fixed_s=2.0)
    loop.steps(20, 0.1)
    loop.idle(2.1, polls=3)
    assert len(loop.hangs) == 1 and loop.hangs[0].allowed_s == 2.0


def test_a_stalled_thread_probes_for_a_census_long_before_its_allowance(now: list[float]) -> None:
    loop = Loop(now, floor_s=100.0)
    loop.steps(20, 0.1)
    loop.idle(4.9, polls=7)
    assert loop.probes == [], "stalled for less than any step: no store request"
    loop.idle(6.0, polls=2)
    assert loop.probes and loop.hangs == []


def test_no_activity_no_watch(now: list[float]) -> None:
    loop = Loop(now, floor_s=1.0, startup_s=1.0)
    loop.activity = None  # finish() closed the run
    loop.idle(1000)
    assert loop.hangs == [] and loop.probes == []


def state(rank: int, *, waiting: bool, step: int | None = 10, where: str = "train.py:1 in step") -> RankState:
    return RankState(rank, f"n{rank // 2 + 1}", step, waiting, where, 200.0)


def test_the_rank_outside_the_collective_is_the_suspect_not_those_waiting_for_it() -> None:
    states = {0: state(0, waiting=True), 1: state(1, waiting=False, where="train.py:40 in slow_loader"),
              2: state(2, waiting=True), 3: state(3, waiting=True)}
    suspects, why = name_suspects(states, 4)
    assert suspects == [1] and "train.py:40" in why


def test_a_rank_that_does_not_answer_is_the_suspect() -> None:
    states = {0: state(0, waiting=True), 2: state(2, waiting=True), 3: state(3, waiting=True)}
    suspects, why = name_suspects(states, 4)
    assert suspects == [1] and "did not answer" in why


def test_when_every_rank_waits_the_ranks_behind_are_the_suspects_and_if_none_is_behind_no_one() -> None:
    states = {r: state(r, waiting=True, step=10 if r != 2 else 9) for r in range(4)}
    assert name_suspects(states, 4)[0] == [2]
    same = {r: state(r, waiting=True) for r in range(4)}
    suspects, why = name_suspects(same, 4)
    assert suspects == [] and "no rank stands out" in why
    busy = {r: state(r, waiting=False) for r in range(4)}  # NCCL: every stack is in user code
    assert name_suspects(busy, 4)[0] == []


def test_exclusions_grow_never_shrink_and_stop_at_the_limit() -> None:
    p = exclusion.plan(["n1"], ["n2", "n1", "n3"], max_excluded=2)
    assert p.nodes == ("n1", "n2") and p.added == ("n2",) and p.refused == ("n3",)
    assert "max_excluded_nodes=2" in p.why
    roomy = exclusion.plan([], ["n2", "n3"], max_excluded=4, room=1)
    assert roomy.nodes == ("n2",) and roomy.refused == ("n3",), "the partition must keep the nodes the job needs"
    assert exclusion.plan(["n1"], ["n1"], max_excluded=4, room=0).added == ()


def test_the_room_to_exclude_counts_every_node_of_the_partition_and_the_nodes_the_job_was_allocated(
    monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster campaign: a 3-node --no-kill job that had lost nodes showed NumNodes=1, and the nodes down at the
    time were excluded as if they cost nothing; when they came back the job needed 3 of 4 nodes with 3 excluded and
    pended for ever (BadConstraints). Every node of the partition counts, and the job's allocated count."""
    from slurmrt import _slurm

    answers = {"scontrol": "JobId=699 Partition=low NumNodes=1 ExcNodeList=n4 NodeList=n2\n",
               "sinfo": "1\n3\n"}  # n1 and n3 drained, n2 and n4 idle: 4 nodes all the same
    monkeypatch.setattr(_slurm, "run", lambda command, *args, timeout_s=30.0: subprocess.CompletedProcess(
        [command, *args], 0, answers[command], ""))
    prepared = exclusion.prepare("699", ["n1", "n3"], max_excluded=8, needed=3)
    assert isinstance(prepared, exclusion.Plan) and prepared.nodes == ("n4",) and prepared.refused == ("n1", "n3")
    shrunk = exclusion.prepare("699", ["n1", "n3"], max_excluded=8)  # what scontrol says alone: 1 node
    assert isinstance(shrunk, exclusion.Plan) and shrunk.added == ("n1", "n3")


def test_scontrol_show_job_is_read_for_the_exclusions_the_node_count_and_the_partition() -> None:
    text = ("JobId=7 JobName=x UserId=root(0) Partition=low NumNodes=2 NumCPUs=2 ReqNodeList=(null) "
            "ExcNodeList=n[2-3] NodeList=n[1,4]")
    job = exclusion.parse_job(text)
    assert job.excluded == ("n2", "n3") and job.num_nodes == 2 and job.partition == "low"
    assert exclusion.parse_job("JobId=7 ExcNodeList=(null) NumNodes=2-2").excluded == ()


def run(restart: int, resumed: int | None, saves: list[int]) -> Run:
    events = [{"event": "init", "restart": restart}]
    if resumed is not None:
        events.append({"event": "resume", "step": resumed})
    events += [{"event": "save", "step": s} for s in saves]
    return Run(restart, events)


def test_runs_that_commit_nothing_newer_are_counted_and_the_third_stops_the_requeue() -> None:
    history = [run(0, None, [10, 20]), run(1, 20, [30]), run(2, 30, []), run(3, 30, [30]), run(4, 30, [])]
    assert outcome.futile_runs(history) == 3
    assert outcome.futile_runs(history[:2]) == 0
    assert outcome.futile_runs([run(0, None, [])]) == 1
    from slurmrt.recovery.facts import Facts
    from slurmrt.recovery.plan import Trigger, plan
    from slurmrt.stop.decision import Reason, StopDecision

    decision = StopDecision(30, frozenset({Reason.SIGNAL}), True)
    facts = Facts(job="7", restart_count=4)

    def choose(futile: int, max_futile: int | None = 3) -> Any:
        policy = RecoverySection(max_futile_runs=max_futile)
        return plan(Trigger.STOPPED, replace(facts, futile=futile, policy=policy), stop=decision)

    assert choose(2).outcome is outcome.Outcome.REQUEUED
    stopped = choose(3)
    assert stopped.outcome is outcome.Outcome.STOPPED and "requeue loop" in stopped.why
    assert choose(9, max_futile=None).outcome is outcome.Outcome.REQUEUED


def test_a_peer_failure_is_told_from_other_errors() -> None:
    from slurmrt._errors import AgreementError
    from slurmrt.hang.response import is_peer_failure

    assert is_peer_failure(AgreementError("the ranks can no longer agree"))
    assert is_peer_failure(RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:4242"))
    assert not is_peer_failure(RuntimeError("CUDA out of memory"))
    assert not is_peer_failure(None)


def _rank0_of_two() -> Any:
    """Rank 0 of a 2-task step on nodes n1 and n2."""
    from slurmrt.launch.topology import from_environ

    return from_environ({
        "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURMD_NODENAME": "n1"})


def _no_exit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The hang response's exit codes, raised as SystemExit instead of ending the test process."""
    from slurmrt.hang import response as _hang

    exits: list[int] = []

    def exit_now(code: int) -> None:
        exits.append(int(code))
        raise SystemExit(int(code))

    monkeypatch.setattr(_hang, "exit_now", exit_now)
    return exits


def _executor(topo: Any, log: Any) -> Any:
    """The recovery executor of rank 0 of job 7, as init() builds it."""
    from slurmrt.record.events import EventLog
    from slurmrt.recovery.executor import Executor
    from slurmrt.recovery.facts import resolve

    facts = resolve(RecoverySection(), topo, {}, kill_switch=None)
    return Executor(facts, EventLog(log, job="7", restart=0, rank=0), node=topo.hostname)


def _in_job_executor(topo: Any, log: Any, run_dir: Any) -> Any:
    """:func:`_executor` of a step that `slurmrt run` started (run directory ``run_dir``, attempt 0, spare n3)."""
    import dataclasses

    from slurmrt.recovery.executor import Executor
    from slurmrt.recovery.facts import InJob, Spares

    base = _executor(topo, log)
    facts = dataclasses.replace(base.facts, in_job=InJob(run_dir, 0, Spares(("n3",), 3)))
    return Executor(facts, base.events, node="n1")


def test_without_a_census_a_rank_names_nobody_and_excludes_no_node(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, but no rendezvous store to meet in: the rank knows only itself, which must not make every other
    rank a suspect (it once did: they all "did not answer")."""
    import json

    from slurmrt.hang import response as _hang

    topo = _rank0_of_two()
    log = tmp_path / "events.jsonl"
    exits = _no_exit(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the requeue fails, and says so
    response = _hang.HangResponse(topo, _executor(topo, log),
                                  kill_switch_seen=lambda: False, last_step=lambda: 5, census=lambda: None)
    with pytest.raises(SystemExit):
        response.hung(Hang(Activity("step", 0.0), 200.0, 180.0))
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (suspects,) = [e for e in events if e["event"] == "suspects"]
    assert suspects["suspects"] == [] and suspects["nodes"] == []
    assert not [e for e in events if e["event"] == "exclude"] and exits == [5]


def test_once_slurm_takes_the_step_down_the_census_waits_only_briefly_for_a_dead_rank(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM arrived (``--kill-on-bad-exit``): the survivor must requeue and exit long before KillWait, and before
    slurmd's answer to the step's cancel times out (else slurmctld retries the signal into the requeued run). The
    census would otherwise wait its whole time (here an hour) for the rank that died."""
    import json
    import threading

    from torch.distributed import HashStore

    from slurmrt.hang import response as _hang
    from slurmrt.hang.census import Census

    topo = _rank0_of_two()
    store = HashStore()
    census = Census(store, prefix="c/", rank=0, world=2)
    Census(store, prefix="c/", rank=1, world=2).register("n2")  # rank 1 registered, then died: it never answers
    log = tmp_path / "events.jsonl"
    exits = _no_exit(monkeypatch)
    monkeypatch.setattr(_hang, "HURRIED_S", 0.3)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the requeue fails, and says so
    response = _hang.HangResponse(topo, _executor(topo, log),
                                  kill_switch_seen=lambda: False, last_step=lambda: 5, census=lambda: census,
                                  census_wait_s=3600.0, terminating=lambda: True)

    def respond() -> None:
        with pytest.raises(SystemExit):
            response.lost_peer(RuntimeError("Connection closed by peer"))

    thread = threading.Thread(target=respond, daemon=True)
    thread.start()
    thread.join(600)  # an hour's census if the wait did not shrink
    assert not thread.is_alive() and exits == [5]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (suspects,) = [e for e in events if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [1] and suspects["nodes"] == ["n2"]


@pytest.mark.parametrize(("seen", "outcome"), [({1: ("n2", "Killed")}, "PEER_LOST"),
                                               ({}, "HUNG"),
                                               ({1: ("n2", "Exited with exit code 3")}, "HUNG")])
def test_a_hang_whose_every_suspect_srun_saw_killed_is_recorded_as_a_lost_peer(
        tmp_path, monkeypatch: pytest.MonkeyPatch, seen: dict[int, tuple[str, str]], outcome: str) -> None:
    """The watchdog fired on rank 0 (its collective waits on a peer); rank 1 never answers the census. Where srun saw
    rank 1's task killed (slurmrt run's record of the step), the run ended on a lost peer, not a hang; where srun saw
    nothing, or an answer of slurmrt's own, it stays a hang."""
    import json

    from torch.distributed import HashStore

    from slurmrt.hang import response as _hang
    from slurmrt.hang.census import Census
    from slurmrt.hang.ended import SeenEnded
    from slurmrt.recovery.injob import EndedReader

    topo = _rank0_of_two()
    store = HashStore()
    census = Census(store, prefix="c/", rank=0, world=2)
    Census(store, prefix="c/", rank=1, world=2).register("n2")  # rank 1 registered, then never answered
    log = tmp_path / "events.jsonl"
    exits = _no_exit(monkeypatch)
    monkeypatch.setattr(_hang, "HURRIED_S", 0.3)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the requeue fails, and says so
    response = _hang.HangResponse(topo, _executor(topo, log), kill_switch_seen=lambda: False, last_step=lambda: 5,
                                  census=lambda: census, census_wait_s=3600.0, terminating=lambda: True)
    reader = EndedReader(None, tasks_are_ranks=False)  # what slurmrt run would have told: srun's view
    reader.last = seen
    response._seen = SeenEnded(reader)
    with pytest.raises(SystemExit):
        response.hung(Hang(Activity("step", 0.0), 200.0, 180.0))
    assert exits == [5]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["outcome"] for e in events if e["event"] == "exit"] == [outcome]


def test_a_requeue_its_leader_chose_but_did_not_live_to_make_is_made_by_the_rank_that_finds_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos campaign (seed 308, trial 7): rank 0 stopped on a signal and recorded its exit (REQUEUED), then was
    SIGKILLed before `scontrol requeue`. Rank 1 found its peer gone and the run answered: it did nothing, and the
    job ended dead with exit 3. The rank that finds a requeue chosen and not made makes it."""
    import json

    from slurmrt.hang import response as _hang
    from slurmrt.record.events import Event, EventLog
    from slurmrt.recovery.executor import Executor
    from slurmrt.recovery.facts import Facts

    topo = _rank0_of_two()
    log = tmp_path / "events.jsonl"
    EventLog(log, job="7", restart=0, rank=0).emit(Event.EXIT, code=3, outcome="REQUEUED", action="requeue",
                                                   exclude=[], why="stopped at step 121 (signal): requeue", lead=True)
    exits = _no_exit(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the job's state is unknown, which does not stop it
    requeued: list[str] = []
    executor = Executor(Facts(job="7"), EventLog(log, job="7", restart=0, rank=1), node="n2",
                        requeue_job=lambda job: (requeued.append(job) is None, f"requeued {job}"))
    response = _hang.HangResponse(topo, executor, kill_switch_seen=lambda: False, last_step=lambda: 121,
                                  census=lambda: None)
    with pytest.raises(SystemExit):
        response.lost_peer(RuntimeError("Connection closed by peer"))
    assert requeued == ["7"] and exits == [3]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] in ("exit", "requeue")] == ["exit", "requeue"]  # no 2nd answer
    with pytest.raises(SystemExit):  # a rank that wakes later finds the requeue made: nothing more
        _hang.HangResponse(topo, executor, kill_switch_seen=lambda: False, last_step=lambda: 121,
                           census=lambda: None).lost_peer(RuntimeError("Connection closed by peer"))
    assert requeued == ["7"] and exits == [3, 5]


def test_the_census_counts_answers_and_waits_inside_the_store() -> None:
    """The leader polls one counter, and reads the answers once; the others wait for the verdict in the store."""
    from torch.distributed import HashStore

    from slurmrt.hang.census import Census, RankState

    store = HashStore()
    ranks = [Census(store, prefix="c/", rank=r, world=3) for r in range(3)]
    for r, census in enumerate(ranks):
        census.answer(RankState(r, f"n{r + 1}", 7, True, "all_reduce", 1.0))
    ranks[2].answer(RankState(2, "n3", 8, True, "all_reduce", 1.0))  # answered again: counted once
    assert int(store.add("c/answered", 0)) == 3
    states = ranks[0].collect(3600.0)  # all answered: no wait
    assert sorted(states) == [0, 1, 2] and states[2].step == 8
    assert ranks[1].wait_finished(0.2) is None  # no verdict yet
    ranks[0].finish("requeued")
    assert ranks[1].wait_finished(5.0) == "requeued" and ranks[2].wait_finished(5.0) == "requeued"
    ranks[0].wait_acknowledged(states, 5.0)
    assert int(store.add("c/acked", 0)) == 2
    missing = [Census(store, prefix="d/", rank=r, world=3) for r in range(3)]
    missing[1].answer(RankState(1, "n2", 7, True, "all_reduce", 1.0))
    assert sorted(missing[0].collect(0.3)) == [1]  # the time is up: the answers there are read one by one


def test_a_rank_srun_saw_end_is_not_waited_for(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `slurmrt run`, srun's line for a task that ended reaches the run directory (ended-<attempt>.json): the
    census stops waiting for that rank at once (here its wait is an hour, and Slurm has not sent SIGTERM), names it,
    and says what srun saw."""
    import json
    import threading

    from torch.distributed import HashStore

    from slurmrt._safefs import private_dir
    from slurmrt.hang import response as _hang
    from slurmrt.hang.census import Census
    from slurmrt.recovery import injob

    topo = _rank0_of_two()
    store = HashStore()
    census = Census(store, prefix="c/", rank=0, world=2)
    Census(store, prefix="c/", rank=1, world=2).register("n2")
    log, run_dir = tmp_path / "events.jsonl", private_dir(tmp_path / "run")
    injob.write_ended(run_dir, 0, {1: ("n2", "Killed")})
    exits = _no_exit(monkeypatch)
    executor = _in_job_executor(topo, log, run_dir)
    response = _hang.HangResponse(topo, executor, kill_switch_seen=lambda: False, last_step=lambda: 5,
                                  census=lambda: census, census_wait_s=3600.0, terminating=lambda: False)

    def respond() -> None:
        with pytest.raises(SystemExit):
            response.lost_peer(RuntimeError("Connection closed by peer"))

    thread = threading.Thread(target=respond, daemon=True)
    thread.start()
    thread.join(600)
    assert not thread.is_alive() and exits == [5]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (suspects,) = [e for e in events if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [1] and suspects["nodes"] == ["n2"]
    assert "srun saw rank 1 end (Killed, on n2)" in suspects["why"]
    assert injob.read_request(run_dir, 0) is not None  # the in-job restart was asked for


def test_the_census_waits_for_a_rank_that_ended_only_if_it_never_answered() -> None:
    """A rank named as ended that answered first (it exited after its answer), or this rank itself, or a rank beyond
    the world, does not shorten the wait for the ranks still to answer."""
    from torch.distributed import HashStore

    from slurmrt.hang.census import Census, RankState

    store = HashStore()
    ranks = [Census(store, prefix="c/", rank=r, world=3) for r in range(3)]
    ranks[0].answer(RankState(0, "n1", 7, True, "all_reduce", 1.0))
    ranks[2].answer(RankState(2, "n3", 7, True, "all_reduce", 1.0))
    polls: list[int] = []

    def wait() -> float:  # an hour, until the census polled 3 times
        polls.append(1)
        return 3600.0 if len(polls) < 3 else 0.0

    assert sorted(ranks[0].collect(wait, ended=lambda: [0, 2, 7])) == [0, 2] and len(polls) == 3
    polls.clear()
    assert sorted(ranks[0].collect(wait, ended=lambda: [1])) == [0, 2] and len(polls) == 1  # rank 1: not waited for


def test_a_stalled_rank_told_that_a_peer_ended_responds_at_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's collectives wait on the GPU and need not fail when a peer dies: the stalled survivor learns it from
    srun's line (through `slurmrt run`), not from its own allowance. A peer that ended on slurmrt's own answer (exit
    3: a requeue every rank takes) is no lost peer."""
    import json
    import threading

    from torch.distributed import HashStore

    from slurmrt._safefs import private_dir
    from slurmrt.hang import response as _hang
    from slurmrt.hang.census import Census
    from slurmrt.recovery import injob

    topo = _rank0_of_two()
    census = Census(HashStore(), prefix="c/", rank=0, world=2)
    log, run_dir = tmp_path / "events.jsonl", private_dir(tmp_path / "run")
    exits = _no_exit(monkeypatch)
    executor = _in_job_executor(topo, log, run_dir)

    def response() -> Any:
        return _hang.HangResponse(topo, executor, kill_switch_seen=lambda: False, last_step=lambda: 5,
                                  census=lambda: census, census_wait_s=3600.0)

    response().peer_ended(12.0)  # nothing ended: back to waiting
    injob.write_ended(run_dir, 0, {0: ("n1", "Killed"), 1: ("n2", "Exited with exit code 3")})
    response().peer_ended(12.0)  # itself, and a peer that took slurmrt's answer: no lost peer
    assert exits == [] and not log.exists()
    injob.write_ended(run_dir, 0, {1: ("n2", "Segmentation fault")})

    def respond() -> None:
        with pytest.raises(SystemExit):
            response().peer_ended(12.0)

    thread = threading.Thread(target=respond, daemon=True)
    thread.start()
    thread.join(600)
    assert not thread.is_alive() and exits == [5]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["activity"] == "lost_peer" and "srun saw rank 1 (Segmentation fault, on n2) end" in hang["where"]
    (suspects,) = [e for e in events if e["event"] == "suspects"]
    assert [s["rank"] for s in suspects["suspects"]] == [1]


def test_a_rank_stalled_in_a_step_joins_the_answer_a_peer_made(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Seen in the goodput benchmark: rank 1 was frozen (SIGSTOP) early in a run, when its step allowance was longer
    than Slurm's kill wait. Rank 0 answered the hang (exit 5, its exit recorded) and was gone with the store. Woken,
    rank 1 waited in gloo on a send to the gone peer (slurmrt._tree) and was killed at the kill wait, with no stacks
    and no line. Stalled in a step, a rank that srun saw a peer end on slurmrt's answer joins that answer at once;
    stalled elsewhere (a save, a phase: collectives of its own), it keeps to its allowance."""
    import dataclasses
    import json
    import logging

    from slurmrt._safefs import private_dir
    from slurmrt.hang import response as _hang
    from slurmrt.hang.census import Census
    from slurmrt.record.events import EventLog
    from slurmrt.recovery import injob
    from slurmrt.recovery.executor import Executor
    from slurmrt.recovery.plan import Trigger

    class Gone:  # the store, hosted by rank 0's process, which has exited
        def __getattr__(self, name: str) -> Any:
            def call(*args: Any) -> Any:
                raise RuntimeError("Connection reset by peer")
            return call

    topo0 = _rank0_of_two()
    topo1 = dataclasses.replace(topo0, rank=1, node_rank=1, hostname="n2")
    log, run_dir = tmp_path / "events.jsonl", private_dir(tmp_path / "run")
    exits = _no_exit(monkeypatch)
    _in_job_executor(topo0, log, run_dir).recover(Trigger.HANG, nodes=["n2"], step=5, detail="rank 1 hung")
    injob.write_ended(run_dir, 0, {0: ("n1", "Exited with exit code 5")})
    executor = Executor(_in_job_executor(topo1, log, run_dir).facts, EventLog(log, job="7", restart=0, rank=1),
                        node="n2")

    def response() -> Any:
        return _hang.HangResponse(topo1, executor, kill_switch_seen=lambda: False, last_step=lambda: 5,
                                  census=lambda: Census(Gone(), prefix="c/", rank=1, world=2), census_wait_s=3600.0)

    response().peer_ended(12.0)  # stalled in a save or a phase: its own allowance decides
    assert exits == []
    caplog.set_level(logging.INFO, logger="slurmrt")
    with pytest.raises(SystemExit):
        response().peer_ended(12.0, in_step=True)
    assert exits == [5]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["rank"] == 1 and hang["activity"] == "stalled" and hang["stacks"]
    assert [e["rank"] for e in events if e["event"] == "exit"] == [0]  # no second answer
    said = [r for r in caplog.records if r.name.startswith("slurmrt")]
    assert all(r.levelno <= logging.INFO for r in said), [r.getMessage() for r in said]
    assert any("response was made already" in r.getMessage() for r in said)


def test_a_clean_up_error_raised_on_the_way_out_of_a_lost_peer_is_still_a_lost_peer() -> None:
    from slurmrt.hang.response import is_peer_failure

    try:
        try:
            raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3461")
        except RuntimeError:
            raise BufferError("cannot close exported pointers exist")  # noqa: B904 - as contextlib's exit raises it
    except BufferError as err:
        assert is_peer_failure(err)
    looped = ValueError("x")
    looped.__context__ = looped  # a cycle ends the walk
    assert not is_peer_failure(looped)
    assert not is_peer_failure(BufferError("cannot close exported pointers exist"))


def test_the_barrier_over_the_trainings_own_backend_fails_when_its_collective_does_not_complete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the process-group boundary: an all-reduce over the default group (NCCL on a cluster) that does not
    complete within the floor is the health check's finding; one that completes passes; no group, nothing."""
    import torch.distributed as dist

    from slurmrt.hang.monitor import backend_barrier

    backend_barrier(1.0)  # no default group in a unit test: nothing to check
    done: list[float] = []

    class Work:
        def __init__(self, completes: bool) -> None:
            self.completes = completes

        def wait(self, timeout: Any) -> bool:
            done.append(timeout.total_seconds())
            return self.completes

    completes = [True]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "all_reduce", lambda t, async_op=False: Work(completes[0]))
    backend_barrier(7.0)
    completes[0] = False
    with pytest.raises(RuntimeError, match="all-reduce over the training's gloo group did not complete in 7 s"):
        backend_barrier(7.0)
    assert done == [7.0, 7.0]
