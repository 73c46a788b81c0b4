"""Lightning's ``Trainer`` with slurmrt: the topology from slurmrt, the agreed stop, atomic checkpoints, requeue.

A few lines in a Lightning script (the ``lightning`` package, 2.x)::

    rt = slurmrt.init(checkpoint_dir="/shared/ckpt/run17")       # first, before anything touches CUDA
    trainer = L.Trainer(devices=rt.local_world_size, num_nodes=rt.nnodes,
                        plugins=[SlurmrtEnvironment(rt)], callbacks=[SlurmrtCallback(rt, every_n_steps=500)])
    trainer.fit(model, data, ckpt_path=resume_from(rt))       # the newest complete checkpoint, or None
    rt.exit()                                                 # exit code and requeue

What changes against Lightning's own SLURM support:

- :class:`SlurmrtEnvironment` takes ranks, world size and the master address from slurmrt's topology, which is right
  for job steps on a subset of the nodes and under launchers (Lightning's ``SLURMEnvironment`` takes the master from
  the job's ``SLURM_NODELIST``, wrong for a step on other nodes), and it checks ``devices`` and ``num_nodes``
  against the launch. With it, Lightning's ``auto_requeue`` is off: Lightning saves a checkpoint and runs
  ``scontrol requeue`` inside its SIGUSR1 handler, where a save can deadlock (Lightning #21406), on rank 0 alone.
- :class:`SlurmrtCallback` puts slurmrt's signal recorders back at the start of training (Lightning installs a
  SIGTERM handler of its own, which issues a collective inside the handler); asks ``rt.should_stop`` after each
  training batch; checks each step's loss before its backward pass (``rt.check``: a loss that is not finite on any
  rank, or spikes, raises ``TrainingHealthError`` on every rank before the update); saves through
  ``trainer.save_checkpoint`` into slurmrt's commit (the stop, and every ``every_n_steps`` steps); and stops the
  Trainer at the agreed step on every rank. Validation time is left out of
  the measured step time. The requeue is ``rt.exit()``'s.
- Checkpoints are slurmrt's ``step_N/last.ckpt`` (``keep_last`` newest), not ``hpc_ckpt_N`` files that pile up.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.callbacks import Callback

from .._errors import ConfigError
from ._latest import latest_directory

__all__ = ["CHECKPOINT_FILE", "SlurmrtCallback", "SlurmrtEnvironment", "resume_from"]

logger = logging.getLogger(__name__)

#: The Lightning checkpoint inside each of slurmrt's step directories.
CHECKPOINT_FILE = "last.ckpt"


def resume_from(rt: Any) -> str | None:
    """``trainer.fit(..., ckpt_path=...)``: the newest complete checkpoint, the same on every rank; None on a fresh
    start. Collective: every rank calls it. It initializes ``torch.distributed`` when Lightning has not yet (it does
    only inside ``fit``), with the backend Lightning's DDP would choose: NCCL with GPUs, else gloo."""
    directory = latest_directory(rt, framework="SlurmrtCallback (Lightning)", holds=CHECKPOINT_FILE)
    if directory is None:
        return None
    return str(directory / CHECKPOINT_FILE)


class SlurmrtEnvironment(ClusterEnvironment):  # type: ignore[misc]
    """Lightning's cluster environment from slurmrt's topology. One process per device, started by the launch
    (``srun`` with one task per GPU, or a launcher such as torchrun): Lightning starts no processes itself."""

    def __init__(self, rt: Any) -> None:
        super().__init__()
        self.rt = rt

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return str(self.rt.master_addr)

    @property
    def main_port(self) -> int:
        return int(self.rt.master_port)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return int(self.rt.world_size)

    def set_world_size(self, size: int) -> None:
        if size != self.rt.world_size:
            raise ValueError(f"Lightning computed a world size of {size} (devices x num_nodes), the launch has "
                             f"{self.rt.world_size} processes: set devices={self.rt.local_world_size}, "
                             f"num_nodes={self.rt.nnodes}")

    def global_rank(self) -> int:
        return int(self.rt.rank)

    def set_global_rank(self, rank: int) -> None:
        if rank != self.rt.rank:
            raise ValueError(f"Lightning computed global rank {rank}, the launch says {self.rt.rank}")

    def local_rank(self) -> int:
        return int(self.rt.local_rank)

    def node_rank(self) -> int:
        return int(self.rt.node_rank)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices != self.rt.local_world_size or num_nodes != self.rt.nnodes:
            raise ValueError(
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) does not match the launch: "
                f"{self.rt.local_world_size} process(es) per node on {self.rt.nnodes} node(s). slurmrt starts no "
                f"processes: set devices={self.rt.local_world_size}, num_nodes={self.rt.nnodes}, or change the "
                "tasks per node of the launch (one task per device)")


class SlurmrtCallback(Callback):  # type: ignore[misc]
    """The agreed stop and atomic checkpoints for a Lightning ``Trainer`` (see the module).

    ``save_every``: also save every N optimizer steps, or ``"auto"``: when ``rt.should_save`` says (the measured save
    stall against the job's failure rate); 0 or None: only at the stop (``every_n_steps`` is its older name).
    ``trainer.global_step`` labels the checkpoints, which go to the shared tier."""

    def __init__(self, rt: Any, *, save_every: int | str | None = None, every_n_steps: int | None = None) -> None:
        super().__init__()
        every = save_every if save_every is not None else every_n_steps
        if not (every is None or every == "auto" or (isinstance(every, int) and every >= 0)):
            raise ConfigError(f"SlurmrtCallback(save_every={every!r}): a number of steps, 'auto' or None",
                              save_every=every)
        self.rt = rt
        self.every_n_steps = every or 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.rt.reclaim_signals()  # Lightning's signal connector replaced the SIGTERM handler at the start of fit
        if pl_module.automatic_optimization and not getattr(pl_module.training_step, "_slurmrt_skips", False):
            pl_module.training_step = _skipping(self.rt, trainer, pl_module)
        elif not pl_module.automatic_optimization:
            logger.info("manual optimization: a rewind past a fault that came back cannot skip its batches here "
                        "(rt.skip(step) in training_step does)")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        # Every rank, every optimizer step (collective): a bad loss stops every rank here, before the update. A
        # skipped step's loss is no loss of the training's.
        if not self.rt.skip(trainer.global_step):
            self.rt.check(trainer.global_step, loss=loss.detach())

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.rt.skip(trainer.global_step):  # no gradient: torch's optimizers leave the weights and their state
            for p in pl_module.parameters():
                p.grad = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.rt.should_stop(step):
            self._save(trainer, step)
            trainer.should_stop = True
        elif self.every_n_steps == "auto":
            if self.rt.should_save(step):
                self._save(trainer, step)
        elif self.every_n_steps and step % self.every_n_steps == 0:
            self._save(trainer, step)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        # Validation runs between two training steps: a phase for the hang watchdog, and not step time.
        self._validation = self.rt.phase("validation")
        self._validation.__enter__()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        validation, self._validation = self._validation, None
        if validation is not None:
            validation.__exit__(None, None, None)
        self.rt.restart_step_clock()

    _validation: Any = None

    def _save(self, trainer: Any, step: int) -> None:
        # Every rank calls save_checkpoint (it has a barrier inside); rank 0 writes the file.
        self.rt.save(lambda directory: trainer.save_checkpoint(directory / CHECKPOINT_FILE), step=step)


def _skipping(rt: Any, trainer: Any, pl_module: Any) -> Any:
    """``pl_module.training_step`` that skips the batch of each step ``rt.skip`` names (a rewind past a fault that
    came back: docs/guides/training-health.md): it returns a zero loss made of the parameters, whose backward gives
    every data-parallel rank the same collectives (Lightning refuses a None under DDP), and ``SlurmrtCallback`` takes
    the gradients away before the optimizer step, so that the weights and the optimizer's state stay as they were;
    the step is counted, as a loop that ``continue``s counts it (a learning-rate schedule moves on)."""
    training_step = pl_module.training_step

    @functools.wraps(training_step)
    def step(*args: Any, **kwargs: Any) -> Any:
        if rt.skip(trainer.global_step):
            return sum(p.sum() for p in pl_module.parameters() if p.requires_grad) * 0.0
        return training_step(*args, **kwargs)

    step._slurmrt_skips = True  # type: ignore[attr-defined]
    return step
