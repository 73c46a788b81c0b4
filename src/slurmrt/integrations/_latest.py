"""What the trainers' ``resume_from`` helpers share: the newest checkpoint, as the directory a framework wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["latest_directory"]


def latest_directory(rt: Any, *, framework: str, holds: str | None = None) -> Path | None:
    """The committed directory of the newest checkpoint, the same on every rank; None on a fresh start. Collective.

    Finding the checkpoint every rank can read is a collective over ``torch.distributed``. A framework may not have
    initialized it yet (Lightning does only inside ``fit``; the Trainer once its ``TrainingArguments`` pick a
    device): so this initializes it when it is not, with the backend the framework would choose (NCCL with GPUs,
    else gloo), from the variables slurmrt.init() exported; the framework then finds it initialized and uses it.

    A checkpoint that is not a directory the framework wrote (a state dict saved by ``rt.save``, or a directory
    without ``holds``) means the directory is shared with another kind of job: :class:`FileNotFoundError` says so.
    """
    if rt.world_size > 1:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # env://
    got = rt.load_latest()
    if got is None:
        return None
    step, directory = got
    if not isinstance(directory, Path) or (holds is not None and not (directory / holds).is_file()):
        what = f"holds no {holds}" if holds is not None else "holds a state dict, not a directory"
        raise FileNotFoundError(f"the checkpoint of step {step} in {rt.options.checkpoint_dir} {what}: it was not "
                                f"written by {framework}; use a checkpoint directory of its own for {framework}")
    return directory
