"""The Hugging Face Trainer and Lightning with slurmrt, under `slurmrt sim` with 2 processes on gloo: a preemption,
a checkpoint cut by SIGKILL, a stop that lands during evaluation; each ends with the weights of an uninterrupted
run, bit for bit (same seed, same data order: both examples restore the data position and the RNG states).

Every fault is tied to the job's progress: the preemption comes after the first committed checkpoint (the
simulator's --after-checkpoint), and the SIGKILL and the evaluation signal are sent by a callback at a given step."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from .launch import ROOT
from .test_sim import sim, summary_rows

pytestmark = pytest.mark.timeout(600)

EXAMPLES = {"transformers": ROOT / "examples" / "transformers" / "train.py",
            "lightning": ROOT / "examples" / "lightning" / "train.py"}
STEPS = 40


def _args(framework: str, tmp: Path) -> list[str]:
    # 0.1 s of simulated work per step: the preemption after step 10 lands seconds before the end
    common = ["--checkpoint-dir", str(tmp / "ckpt"), "--steps", str(STEPS), "--weights-out", str(tmp / "w.pt"),
              "--step-time", "0.1"]
    if framework == "transformers":
        return [*common, "--output-dir", str(tmp / "out"), "--save-steps", "10", "--eval-steps", "15"]
    return [*common, "--save-every", "10", "--val-every", "15"]


def _weights(path: Path) -> dict[str, object]:
    import torch

    return dict(torch.load(path))


def _equal(a: dict[str, object], b: dict[str, object]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """The uninterrupted run of each example: its final weights."""
    framework = request.param
    tmp = tmp_path_factory.mktemp(f"{framework}-reference")
    pytest.importorskip(framework)
    out = sim(tmp, "-N", "1", "--ntasks-per-node", "2", "--", sys.executable, str(EXAMPLES[framework]),
              *_args(framework, tmp), timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"finished {STEPS} steps" in out.stdout
    return framework, _weights(tmp / "w.pt")


def test_a_preempted_run_saves_at_the_agreed_step_requeues_and_ends_with_the_same_weights(
        reference: tuple[str, dict], tmp_path: Path) -> None:
    framework, weights = reference
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--preempt-at", "0", "--after-checkpoint",
              "--signal", "USR1", "--grace", "60", "--requeue", "--", sys.executable, str(EXAMPLES[framework]),
              *_args(framework, tmp_path), env={"SLURMRT_PROGRESS_S": "1"}, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    first, second = summary_rows(out.stdout)
    assert first["stop reasons"] == "signal" and first["exit"] == "3" and "requeued" in first["ended by"]
    stopped = int(first["checkpoint"].split()[1])
    assert second["resumed from"] == f"step {stopped}" and second["exit"] == "0"
    assert 10 <= stopped < STEPS, "the preemption came after the first checkpoint, before the end"
    assert _equal(_weights(tmp_path / "w.pt"), weights)


def test_an_evaluation_due_at_the_stops_step_still_runs_and_the_resumed_run_keeps_the_weights(tmp_path: Path) -> None:
    """The Trainer evaluates at every step here, so an evaluation is due wherever the preemption's stop lands. It
    runs, then the save, as in the uninterrupted run: skipping it (as the callback once did at every stop) changed
    the random stream the run resumed with (the evaluation's data loader draws from it), and the final weights."""
    pytest.importorskip("transformers")

    def args(tmp: Path) -> list[str]:
        tmp.mkdir()
        a = _args("transformers", tmp)
        a[a.index("--eval-steps") + 1] = "1"
        return a

    ref = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--", sys.executable, str(EXAMPLES["transformers"]),
              *args(tmp_path / "ref"), timeout=500)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--preempt-at", "0", "--after-checkpoint", "--signal",
              "USR1", "--grace", "60", "--requeue", "--", sys.executable, str(EXAMPLES["transformers"]),
              *args(tmp_path / "run"), env={"SLURMRT_PROGRESS_S": "1"}, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    first, second = summary_rows(out.stdout)
    assert first["stop reasons"] == "signal" and second["exit"] == "0"
    (log,) = (tmp_path / "run" / "ckpt").glob("events-*.jsonl")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    stop = next(e for e in events if e["event"] == "decision")
    after = events[events.index(stop):]
    assert _equal(_weights(tmp_path / "run" / "w.pt"), _weights(tmp_path / "ref" / "w.pt"))
    assert [e["name"] for e in after if e["event"] == "phase" and e["restart"] == 0][:1] == ["evaluate"], after


def test_with_save_every_auto_the_saves_come_when_slurmrt_says_and_a_preempted_run_keeps_the_weights(
        reference: tuple[str, dict], tmp_path: Path) -> None:
    framework, weights = reference
    args = _args(framework, tmp_path)
    flag = "--save-steps" if framework == "transformers" else "--save-every"
    args[args.index(flag) + 1] = "auto"
    # A failure prior of one in 7 node-seconds: Daly's interval is a few seconds, a few saves in the run.
    out = sim(tmp_path, "-N", "1", "--ntasks-per-node", "2", "--preempt-at", "0", "--after-checkpoint",
              "--signal", "USR1", "--grace", "60", "--requeue", "--", sys.executable, str(EXAMPLES[framework]),
              *args, env={"SLURMRT_PROGRESS_S": "1", "SLURMRT_MTBF_NODE_H": "0.002"}, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    first, second = summary_rows(out.stdout)
    assert first["stop reasons"] == "signal" and second["exit"] == "0"
    (log,) = (tmp_path / "ckpt").glob("events-*.jsonl")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    saves = [(e["restart"], e["step"]) for e in events if e["event"] == "save"]
    stop = int(first["checkpoint"].split()[1])
    assert (0, stop) in saves and [s for r, s in saves if r == 0 and s < stop], saves  # saves before the stop's
    assert _equal(_weights(tmp_path / "w.pt"), weights)


# A callback the examples accept (main(callbacks=...)): in run 0 it SIGKILLs rank 0 while step 20 is being saved,
# before slurmrt commits it; in run 1 every rank sends itself SIGUSR1 inside the first evaluation.
FAULTS = {
    "transformers": '''
        from transformers import TrainerCallback

        class Faults(TrainerCallback):
            evaluating = False

            def on_save(self, args, state, control, **kwargs):  # the Trainer has written checkpoint-20
                if RESTART == 0 and state.global_step == 20 and RANK == 0:
                    os.kill(os.getpid(), signal.SIGKILL)

            def on_prediction_step(self, args, state, control, **kwargs):
                if RESTART == 1 and not self.evaluating:
                    self.evaluating = True
                    os.kill(os.getpid(), signal.SIGUSR1)
    ''',
    "lightning": '''
        import lightning as L

        class Faults(L.Callback):
            evaluating = False

            def on_save_checkpoint(self, trainer, pl_module, checkpoint):  # last.ckpt of step 20 is being written
                if RESTART == 0 and trainer.global_step == 20 and RANK == 0:
                    os.kill(os.getpid(), signal.SIGKILL)

            def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                if RESTART == 1 and not self.evaluating:
                    self.evaluating = True
                    os.kill(os.getpid(), signal.SIGUSR1)
    ''',
}


def _requeuing_batch(tmp: Path, script: Path, framework: str) -> Path:
    """A batch script as users write it: the example under srun, and a requeue by the script when slurmrt did not
    answer (a crash, an uncaught error)."""
    batch = tmp / "job.sbatch"
    batch.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 1 --ntasks-per-node=2 --requeue",
        f"srun --kill-on-bad-exit=1 {sys.executable} {script} {' '.join(_args(framework, tmp))}",
        "rc=$?", 'case $rc in 0|3|4) ;; *) scontrol requeue "$SLURM_JOB_ID" ;; esac', "exit $rc", ""]))
    return batch


def test_a_checkpoint_cut_by_sigkill_is_never_resumed_and_a_stop_during_evaluation_is_honoured(
        reference: tuple[str, dict], tmp_path: Path) -> None:
    framework, weights = reference
    script = tmp_path / "faulty.py"
    script.write_text(textwrap.dedent('''
        import os, runpy, signal, sys
        RESTART, RANK = int(os.environ.get("SLURM_RESTART_COUNT", 0)), int(os.environ["SLURM_PROCID"])
    ''') + textwrap.dedent(FAULTS[framework]) + textwrap.dedent(f'''
        example = runpy.run_path({str(EXAMPLES[framework])!r})
        example["main"](sys.argv[1:], callbacks=[Faults()])
    '''))
    out = sim(tmp_path, str(_requeuing_batch(tmp_path, script, framework)), env={"SLURMRT_PROGRESS_S": "1"},
              timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    killed, evaluated, last = summary_rows(out.stdout)
    assert "SIGKILL" in killed["tasks"] and killed["checkpoint"] == "step 10"
    # The cut checkpoint of step 20 was not resumed from: the next run started after step 10.
    assert evaluated["resumed from"] == "step 10"
    # The signal came inside the evaluation after step 15: the stop is at a step after it (the first one, or the
    # one after, as the agreement's round lands), saved and requeued, long before the end.
    assert evaluated["stop reasons"] == "signal" and evaluated["exit"] == "3", evaluated
    stopped = int(evaluated["checkpoint"].split()[1])
    assert 16 <= stopped < STEPS
    assert last["resumed from"] == f"step {stopped}" and last["exit"] == "0"
    assert _equal(_weights(tmp_path / "w.pt"), weights)


# -- the Trainer's own SIGTERM checkpoint (enable_jit_checkpoint) next to slurmrt's stop ------------------------------

JIT_SCRIPT = """\
import os, signal, sys
import torch
import slurmrt
from transformers import Trainer, TrainerCallback, TrainingArguments
from slurmrt.integrations.transformers import SlurmrtCallback, resume_from

rt = slurmrt.init(checkpoint_dir=sys.argv[1])
ours = signal.getsignal(signal.SIGTERM)

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(4, 1)
    def forward(self, x, y):
        return {"loss": ((self.w(x) - y) ** 2).mean()}

data = [{"x": torch.full((4,), float(i)), "y": torch.tensor([float(i)])} for i in range(64)]

def arguments(jit):
    return TrainingArguments(output_dir=sys.argv[2], max_steps=30, per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", disable_tqdm=True, use_cpu=True, enable_jit_checkpoint=jit)

for how in ("built", "added"):
    try:
        if how == "built":
            Trainer(model=Tiny(), args=arguments(True), train_dataset=data, callbacks=[SlurmrtCallback(rt)])
        else:
            trainer = Trainer(model=Tiny(), args=arguments(True), train_dataset=data)
            trainer.add_callback(SlurmrtCallback(rt))
            trainer.train()
        print(how, "ACCEPTED")
    except slurmrt.ConfigError as err:
        print(how, "REFUSED", err)
    print(how, "HANDLER", "slurmrt" if signal.getsignal(signal.SIGTERM) == ours else "other")

class Preempt(TrainerCallback):  # SIGTERM after step 7, tied to progress
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

trainer = Trainer(model=Tiny(), args=arguments(False), train_dataset=data, callbacks=[Preempt(), SlurmrtCallback(rt)])
trainer.train(resume_from_checkpoint=resume_from(rt))
print("STOPPED", trainer.state.global_step, rt.stop_reason.value if rt.stop_reason else None)
sys.exit(int(rt.finish()))
"""


def test_the_trainers_jit_checkpoint_is_refused_next_to_slurmrt_which_keeps_sigterm_and_saves(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import os
    import subprocess

    script = tmp_path / "jit.py"
    script.write_text(JIT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["SLURMRT_SAVE_TIME_S"] = "1"  # a save fits in the SIGTERM's grace time (no first save has measured one)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt"), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    for how in ("built", "added"):
        (said,) = [x for x in lines if x.startswith(f"{how} REFUSED") or x.startswith(f"{how} ACCEPTED")]
        assert "enable_jit_checkpoint=True" in said and "set enable_jit_checkpoint=False" in said, out.stdout
        assert f"{how} HANDLER slurmrt" in lines, "slurmrt's SIGTERM handler is back"
    # Without the JIT checkpoint, SIGTERM is slurmrt's: the stop at the step after it, saved and committed.
    assert "STOPPED 7 sigterm" in lines, out.stdout[-2000:] + out.stderr[-3000:]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_000000007"
    assert not list((tmp_path / "out").glob("checkpoint-*")), "the Trainer's folder moved into slurmrt's checkpoint"
    assert out.returncode == 4, out.stderr[-3000:]  # ExitCode.STOPPED: SIGTERM outside Slurm is not requeued


def test_a_trainer_that_runs_alone_in_each_process_on_cpu_is_told_the_settings_it_needs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from slurmrt.integrations import transformers
    from slurmrt.integrations.transformers import SlurmrtCallback

    monkeypatch.setattr(transformers, "_has_cuda", lambda: False)  # a machine without GPUs, even on one with

    callback = SlurmrtCallback(SimpleNamespace(world_size=2))
    alone = SimpleNamespace(world_size=1, use_cpu=False, load_best_model_at_end=False, enable_jit_checkpoint=False)
    with pytest.raises(RuntimeError, match=r"runs 1 process\(es\), slurmrt counts 2.*use_cpu=True, "
                                           r"ddp_backend='gloo'"):
        callback.on_train_begin(alone, None, None)


#: A callback that makes rank 1's step 13 unhealthy in the first run, where each framework lets slurmrt check it: the
#: loss before its backward pass (Lightning), the gradients before the optimizer step (the Trainer, which hands its
#: callbacks no loss; added before slurmrt's, it runs first).
NAN = {
    "transformers": '''
        import math
        from transformers import TrainerCallback

        class Nan(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                if RESTART == 0 and RANK == 1 and state.global_step == 13:
                    next(p for p in model.parameters() if p.grad is not None).grad.fill_(math.nan)
    ''',
    "lightning": '''
        import lightning as L

        class Nan(L.Callback):
            def on_before_backward(self, trainer, pl_module, loss):
                if RESTART == 0 and RANK == 1 and trainer.global_step == 13:
                    loss.data.fill_(float("nan"))
    ''',
}


def test_a_nan_on_one_rank_stops_every_rank_before_the_update_and_its_node_is_left_out_bitwise(
        reference: tuple[str, dict], tmp_path: Path) -> None:
    """A NaN on rank 1 at step 13 of the first run raises TrainingHealthError on both ranks there (the weights never
    see it); the batch script requeues the failed run, which resumes from step 10 and passes step 13: the fault was
    transient, and rank 1's node is left out at once (a requeue); the last run ends with the uninterrupted run's
    weights."""
    framework, weights = reference
    script = tmp_path / "nan.py"
    script.write_text(textwrap.dedent('''
        import os, runpy, sys
        RESTART, RANK = int(os.environ.get("SLURM_RESTART_COUNT", 0)), int(os.environ["SLURM_PROCID"])
    ''') + textwrap.dedent(NAN[framework]) + textwrap.dedent(f'''
        example = runpy.run_path({str(EXAMPLES[framework])!r})
        example["main"](sys.argv[1:], callbacks=[Nan()])
    '''))
    out = sim(tmp_path, str(_requeuing_batch(tmp_path, script, framework)), timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    failed, passed, last = summary_rows(out.stdout)
    assert failed["checkpoint"] == "step 10" and passed["resumed from"] == "step 10" and last["exit"] == "0"
    # The requeued run passes step 13: the fault was transient, and rank 1's node is left out at once (a requeue).
    assert "suspect" in passed["stop reasons"] and passed["exit"] == "6", passed
    (log,) = (tmp_path / "ckpt").glob("events-*.jsonl")
    events = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "training_health"]
    assert [(e["step"], e["first_rank"], e["what"]) for e in events] == [(13, 1, "nonfinite")], out.stdout[-2000:]
    assert [e["step"] for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "transient_fault"] == [13]
    assert _equal(_weights(tmp_path / "w.pt"), weights)
