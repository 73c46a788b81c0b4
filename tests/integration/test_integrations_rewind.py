"""A fault that comes back each time the run reaches step 13 (rank 1's loss or gradients NaN: the data or the model,
not a node), under Lightning and under the HF Trainer: the first run ends there on every rank and the batch script
requeues it; the next run resumes from step 10, meets the NaN again, and rewinds to the certified checkpoint of step
10, with the steps since to be skipped; the last run resumes there, and each framework's ``SlurmrtCallback`` skips
those steps (no update: the weights and the optimizer's state as they were; the step counted). Its final weights
equal, bit for bit, those of an uninterrupted run that skipped the same steps by a callback of its own."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from .test_integrations import EXAMPLES, STEPS, _args, _equal, _requeuing_batch, _weights
from .test_sim import sim, summary_rows

pytestmark = pytest.mark.timeout(900)

#: Certified 2 healthy steps after a save: the step-10 checkpoint is certified before step 13 comes.
ENV = {"SLURMRT_HEALTH_CERTIFY_AFTER": "2", "SLURMRT_PROGRESS_S": "1"}

#: Each framework's fault (where its callback lets slurmrt check) and its comparator's skip (steps A-B in $SKIP: no
#: gradient at the optimizer step, as an update that never happened).
CALLBACKS = {
    "lightning": """
        import lightning as L

        class Nan(L.Callback):
            def on_before_backward(self, trainer, pl_module, loss):
                if RANK == 1 and trainer.global_step == 13:
                    loss.data.fill_(float("nan"))

        class Skip(L.Callback):
            def on_train_start(self, trainer, pl_module):
                step = pl_module.training_step
                zero = lambda: sum(p.sum() for p in pl_module.parameters()) * 0.0
                pl_module.training_step = lambda *a, **k: zero() if skipped(trainer.global_step) else step(*a, **k)

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                if skipped(trainer.global_step):
                    for p in pl_module.parameters():
                        p.grad = None
    """,
    "transformers": """
        import math
        from transformers import TrainerCallback

        class Nan(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                if RANK == 1 and state.global_step == 13:
                    next(p for p in model.parameters() if p.grad is not None).grad.fill_(math.nan)

        class Skip(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                if skipped(state.global_step):
                    for p in model.parameters():
                        p.grad = None
    """,
}

SCRIPT = """
import os, runpy, sys

RANK, SKIP = int(os.environ["SLURM_PROCID"]), os.environ.get("SKIP")


def skipped(step):
    first, last = map(int, SKIP.split("-"))
    return first <= step <= last
"""


@pytest.mark.parametrize("framework", sorted(CALLBACKS))
def test_a_nan_each_time_at_a_step_is_rewound_and_its_steps_skipped_by_the_frameworks_callback(
        framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    script = tmp_path / "rewind.py"
    script.write_text(textwrap.dedent(SCRIPT) + textwrap.dedent(CALLBACKS[framework]) + textwrap.dedent(f"""
        example = runpy.run_path({str(EXAMPLES[framework])!r})
        example["main"](sys.argv[1:], callbacks=[Skip()] if SKIP else [Nan()])
    """))
    faulted, clean = tmp_path / "faulted", tmp_path / "clean"
    faulted.mkdir()
    clean.mkdir()
    out = sim(faulted, str(_requeuing_batch(faulted, script, framework)), env=ENV, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rerun, rewound, last = summary_rows(out.stdout)
    assert rerun["checkpoint"] == rewound["resumed from"] == last["resumed from"] == "step 10", out.stdout[-3000:]
    assert last["exit"] == "0" and f"finished {STEPS} steps" in out.stdout
    (log,) = (faulted / "ckpt").glob("events-*.jsonl")
    health = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "training_health"]
    assert [(e["step"], e["first_rank"], e["action"]) for e in health] == [(13, 1, "rerun"), (13, 1, "rewind")]
    assert health[1]["certified"] == 10 and health[1]["suspects"] == [], health
    ((first, last_skipped),) = json.loads((faulted / "ckpt" / "health.json").read_text())["skips"]
    assert (first, last_skipped) == (11, 13)
    # The comparator: no fault, and steps 11-13 skipped by its own callback.
    cmd = [sys.executable, str(script), *_args(framework, clean)]
    out = sim(clean, "-N", "1", "--ntasks-per-node", "2", "--", *cmd, env={"SKIP": f"{first}-{last_skipped}"},
              timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _equal(_weights(faulted / "w.pt"), _weights(clean / "w.pt"))
