"""The Hugging Face ``Trainer`` with slurmrt: the agreed stop, atomic checkpoints, requeue and resume.

Three lines in a Trainer script::

    rt = slurmrt.init(checkpoint_dir="/shared/ckpt/run17")          # first, before anything touches CUDA
    trainer = Trainer(..., callbacks=[SlurmrtCallback(rt)])
    trainer.train(resume_from_checkpoint=resume_from(rt))         # the newest complete checkpoint, or None
    rt.exit()                                                     # exit code and requeue

What the callback does:

- At each optimizer step it asks ``rt.should_stop(global_step)``; when every rank agreed to stop (a signal, the
  deadline, the kill switch), the Trainer saves and ends the training loop at that step, on every rank.
- Every checkpoint the Trainer writes (its own schedule, ``save_steps``, and the stop) is committed by slurmrt: once
  every rank has written its part of ``output_dir/checkpoint-N``, rank 0 moves it into slurmrt's temporary directory,
  and slurmrt's commit makes it ``step_N`` in the checkpoint directory (manifest, atomic rename, ``latest``). A save
  cut by SIGKILL leaves at most a partial ``checkpoint-N`` in ``output_dir``, which nothing resumes from.
- Retention is slurmrt's ``keep_last``: the Trainer's ``save_total_limit`` finds no checkpoints of its own to rotate.
- The time the Trainer spends in evaluation is left out of the measured step time. A stop that comes during an
  evaluation is acted on at the first optimizer step after it. An evaluation due at the stop's own step still runs,
  before the save, unless the stop leaves no time for it (SIGTERM, the deadline, Ctrl-C): then the resumed run's
  random stream differs from an uninterrupted run's from that step on.
- Before each optimizer step it checks the step's health (``rt.check``) from this rank's gradient norm: the Trainer
  hands its callbacks no loss, so a NaN or an inf anywhere in the loss or the gradients is found there, before the
  update, on every rank; a loss spike is not (docs/guides/training-health.md). One pass over the gradients, as the
  Trainer's own clipping makes (``max_grad_norm``). At a step that a rewind past a fault that came back names, it
  takes the gradients away instead: the optimizer leaves the weights and its state, and the step is counted (the
  batch's forward and backward still ran: the Trainer has no hook before them).
- The Trainer's own SIGTERM checkpoint, ``TrainingArguments(enable_jit_checkpoint=True)``, is refused next to the
  callback (see :data:`JIT_CHECKPOINT_REFUSED`): slurmrt already saves on SIGTERM, at a step every rank agreed on.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .._errors import ConfigError
from ..stop.decision import Reason
from ._latest import latest_directory

__all__ = ["SlurmrtCallback", "resume_from"]

logger = logging.getLogger(__name__)

PREFIX = "checkpoint"  # the Trainer's checkpoint folders: checkpoint-<global step>

#: Why ``enable_jit_checkpoint=True`` and SlurmrtCallback do not go together. The Trainer's JIT checkpoint installs a
#: SIGTERM handler of its own when the Trainer is built, in place of slurmrt's; each rank then saves when it got the
#: signal, 3 s later, at whatever step it is at, without asking the others (a rank that did not get it goes on into
#: the next collective and waits there); and it writes ``checkpoint-N`` in place, where a SIGKILL leaves half of it.
JIT_CHECKPOINT_REFUSED = (
    "TrainingArguments(enable_jit_checkpoint=True) and SlurmrtCallback both save on SIGTERM: two handlers, two "
    "saves racing, and the Trainer's replaces slurmrt's and decides per rank. Keep SlurmrtCallback and set "
    "enable_jit_checkpoint=False: slurmrt saves on SIGTERM and on the --signal warning, at a step every rank agreed "
    "on, and commits the checkpoint atomically. (Without slurmrt, the JIT checkpoint is the Trainer's way.)")


def resume_from(rt: Any) -> str | None:
    """``trainer.train(resume_from_checkpoint=...)``: the newest complete checkpoint, the same on every rank; None
    on a fresh start. Collective: every rank calls it. Like Lightning's helper, it initializes ``torch.distributed``
    when nothing has yet (the Trainer does once its ``TrainingArguments`` pick a device), with NCCL when there are
    GPUs, else gloo: call it after the Trainer is built to keep the backend of ``ddp_backend``."""
    directory = latest_directory(rt, framework="the Trainer")
    if directory is None:
        return None
    return str(directory)


#: The stops that leave no time for an evaluation due at their step: the job's end is seconds away (SIGTERM, the
#: deadline) or the user wants out (Ctrl-C). At the others (the --signal warning, the kill switch, a straggler) the
#: Trainer evaluates, then saves, as an uninterrupted run does at that step: skipping it would lose that point of the
#: curve and change the random stream the run resumes with (the evaluation's data loader draws from it), so the
#: resumed run would not end with an uninterrupted run's weights.
_NO_TIME_TO_EVALUATE = frozenset({Reason.TERM, Reason.DEADLINE, Reason.INTERRUPT})


class SlurmrtCallback(TrainerCallback):  # type: ignore[misc]
    """Plugs slurmrt's agreed stop and atomic checkpoints into a ``transformers.Trainer`` (see the module)."""

    def __init__(self, rt: Any, *, save_every: str | None = None) -> None:
        """``save_every="auto"``: also save when ``rt.should_save`` says (the measured save stall against the job's
        failure rate), on top of the Trainer's own ``save_strategy`` (set it to "no" to leave the choice to
        slurmrt). Checkpoints go to the shared tier."""
        if save_every not in (None, "auto"):
            raise ConfigError(f"SlurmrtCallback(save_every={save_every!r}): 'auto' or None (the Trainer's own "
                              "save_steps say how often in steps)", save_every=save_every)
        self.rt = rt
        self.save_every = save_every

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._refuse_jit_checkpoint(args)

    def _refuse_jit_checkpoint(self, args: Any) -> None:
        if getattr(args, "enable_jit_checkpoint", False):
            self.rt.reclaim_signals()  # the Trainer took SIGTERM when it was built: give it back to slurmrt
            raise ConfigError(JIT_CHECKPOINT_REFUSED, enable_jit_checkpoint=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._refuse_jit_checkpoint(args)  # a callback added after the Trainer was built misses on_init_end
        if args.world_size != self.rt.world_size:
            cpu = "" if getattr(args, "use_cpu", False) or _has_cuda() else (
                " On CPU, the Trainer runs distributed only with TrainingArguments(use_cpu=True, ddp_backend='gloo');"
                " without them it trains alone in each process.")
            raise RuntimeError(f"the Trainer runs {args.world_size} process(es), slurmrt counts {self.rt.world_size}: "
                               f"call slurmrt.init() before TrainingArguments, in every process of the job.{cpu}")
        if args.load_best_model_at_end:
            raise ValueError("load_best_model_at_end=True does not work with SlurmrtCallback: the checkpoints move "
                             "from output_dir into slurmrt's checkpoint directory, where the Trainer does not look "
                             "for its best model. Keep the best model with a callback of your own, or turn it off")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The gradients are reduced (and clipped) and the optimizer has not stepped: raises on every rank when any
        # rank's norm is not finite. global_step counts the steps done, as the checkpoints do.
        model = kwargs.get("model")
        if not self.rt.skip(state.global_step):
            self.rt.check(state.global_step, grad_norm=_grad_norm(model))
        elif model is not None:  # a rewind past a fault that came back names this step: its batch is not trained on
            for p in model.parameters():
                p.grad = None  # torch's optimizers leave the weights and their state; the step is counted

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rt.should_stop(state.global_step):
            control.should_save = True
            control.should_training_stop = True
            if self.rt.stop_reason in _NO_TIME_TO_EVALUATE:
                control.should_evaluate = False  # the save first: an evaluation due now would be cut short
        elif self.save_every == "auto" and self.rt.should_save(state.global_step):
            control.should_save = True
        # The Trainer evaluates, then writes its checkpoint, after this callback and before the next step: a phase
        # for the hang watchdog (neither is a hang, nor step time), from here to on_evaluate or on_save.
        self._saving = bool(control.should_save)
        if control.should_evaluate or control.should_save:
            self._enter("evaluate" if control.should_evaluate else "trainer_save")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._saving:
            self._leave()
        self.rt.restart_step_clock()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        source = Path(args.output_dir) / f"{PREFIX}-{state.global_step}"
        rank = self.rt.rank

        def commit(directory: Path) -> None:
            # Every rank writes into source (rank 0 the model, each rank its RNG state): wait for all of them.
            _barrier()
            if rank == 0:
                _move_contents(source, directory)

        try:
            self.rt.save(commit, step=state.global_step)  # skipped (False) when SIGTERM leaves no time to save
        finally:
            self._leave()

    _phase: Any = None
    _saving = False

    def _enter(self, name: str) -> None:
        self._leave()
        self._phase = self.rt.phase(name)
        self._phase.__enter__()

    def _leave(self) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(None, None, None)


def _grad_norm(model: Any) -> float | None:
    """The norm of this rank's gradients (None: none), whole when they are sharded (a DTensor's)."""
    import torch

    grads = [p.grad for p in model.parameters() if p.grad is not None] if model is not None else []
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _move_contents(source: Path, target: Path) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"the Trainer's checkpoint {source} is missing: output_dir must be the same path "
                                "on every node")
    for entry in source.iterdir():
        try:
            os.replace(entry, target / entry.name)  # same filesystem: a rename
        except OSError:
            shutil.move(str(entry), str(target / entry.name))  # output_dir on another filesystem: a copy
    source.rmdir()
