"""A loss that goes NaN each time Lightning's run reaches step 13 (on rank 1: the data or the model, not a node):
the first run ends there on every rank and the batch script requeues it; the next run resumes from step 10, meets
the NaN again, and rewinds to the certified checkpoint of step 10, with the steps since to be skipped; the last run
resumes there, and ``SlurmrtCallback`` skips those steps' batches (no update: the weights and the optimizer's state
as they were; the step counted). Its final weights equal, bit for bit, those of an uninterrupted run that skipped the
same steps by a callback of its own."""

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

SCRIPT = '''
import os, runpy, sys
import lightning as L

RANK, SKIP = int(os.environ["SLURM_PROCID"]), os.environ.get("SKIP")


class Nan(L.Callback):
    """Rank 1's loss of step 13 is NaN each time a run reaches it."""

    def on_before_backward(self, trainer, pl_module, loss):
        if RANK == 1 and trainer.global_step == 13:
            loss.data.fill_(float("nan"))


class Skip(L.Callback):
    """The comparator, without slurmrt's skip: steps A-B (SKIP) train on no batch (a zero loss, no gradient)."""

    def on_train_start(self, trainer, pl_module):
        self.first, self.last = map(int, SKIP.split("-"))
        step = pl_module.training_step
        zero = lambda: sum(p.sum() for p in pl_module.parameters()) * 0.0
        pl_module.training_step = lambda *a, **k: zero() if self.skipped(trainer) else step(*a, **k)

    def skipped(self, trainer):
        return self.first <= trainer.global_step <= self.last

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.skipped(trainer):
            for p in pl_module.parameters():
                p.grad = None


example = runpy.run_path(EXAMPLES)
example["main"](sys.argv[1:], callbacks=[Skip()] if SKIP else [Nan()])
'''


def test_a_nan_each_time_at_a_step_is_rewound_and_its_batches_skipped_by_lightnings_callback(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    script = tmp_path / "rewind.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("EXAMPLES", repr(str(EXAMPLES["lightning"]))))
    faulted, clean = tmp_path / "faulted", tmp_path / "clean"
    faulted.mkdir()
    clean.mkdir()
    out = sim(faulted, str(_requeuing_batch(faulted, script, "lightning")), env=ENV, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rerun, rewound, last = summary_rows(out.stdout)
    assert rerun["checkpoint"] == rewound["resumed from"] == last["resumed from"] == "step 10", out.stdout[-3000:]
    assert last["exit"] == "0" and f"finished {STEPS} steps" in out.stdout
    (log,) = (faulted / "ckpt").glob("events-*.jsonl")
    health = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "training_health"]
    assert [(e["step"], e["first_rank"], e["action"]) for e in health] == [(13, 1, "rerun"), (13, 1, "rewind")]
    assert health[1]["certified"] == 10 and health[1]["suspects"] == [], health
    (first, last_skipped), = json.loads((faulted / "ckpt" / "health.json").read_text())["skips"]
    # The comparator: no fault, and training_step returns None at the steps the record skipped.
    cmd = [sys.executable, str(script), *_args("lightning", clean)]
    out = sim(clean, "-N", "1", "--ntasks-per-node", "2", "--", *cmd, env={"SKIP": f"{first}-{last_skipped}"},
              timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _equal(_weights(faulted / "w.pt"), _weights(clean / "w.pt"))
