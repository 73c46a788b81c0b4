"""What each experiment tracker needs to continue the same run after a requeue: W&B, MLflow, TensorBoard.

None of them is a dependency: the W&B and TensorBoard helpers return plain values to pass on, and only
:func:`mlflow_start_run` imports its tracker (when called). Call them after ``rt.load_latest()``, on the rank that
logs (usually rank 0)::

    got = rt.load_latest()
    run = wandb.init(project="gpt", **trackers.wandb_args(rt))
    writer = SummaryWriter(logdir, purge_step=trackers.tensorboard_purge_step(rt))
    trackers.mlflow_start_run(rt)

The convention is slurmrt's: ``save(state, step=s)`` follows step ``s``, and the resumed run trains and logs from
``s + 1`` on. What the run logged after step ``s`` before it was stopped is work that was lost; TensorBoard drops
it (``purge_step``), W&B drops it when rewinding, MLflow keeps it (see :func:`mlflow_start_run`).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Protocol

from ._errors import ConfigError
from .record.events import read_events
from .record.experiment import read_trackers, remember_tracker
from .record.goodput import account

__all__ = ["first_step", "goodput_metrics", "mlflow_run_id", "mlflow_start_run", "tensorboard_purge_step",
           "wandb_args"]

logger = logging.getLogger(__name__)

_UNSET: Any = object()


class _Run(Protocol):  # what the helpers read from slurmrt.Runtime
    experiment_id: str
    resumed_step: int | None
    loaded: bool
    options: Any


def first_step(rt: _Run, resumed_step: int | None = _UNSET) -> int:
    """The first step this run trains and logs: 0 on a fresh start, the checkpoint's step + 1 after a resume.

    ``resumed_step`` is the step of the checkpoint resumed from, when the script loads its checkpoints without
    ``rt.load_latest()`` (None: a fresh start)."""
    if resumed_step is _UNSET:
        if not rt.loaded and rt.options.checkpoint_dir is not None:
            raise ConfigError("a tracker helper was called before rt.load_latest(): the step this run resumes from is "
                              "not known yet. Call rt.load_latest() first, or pass resumed_step=")
        resumed_step = rt.resumed_step
    return 0 if resumed_step is None else int(resumed_step) + 1


def tensorboard_purge_step(rt: _Run, resumed_step: int | None = _UNSET) -> int | None:
    """``SummaryWriter(purge_step=...)``: TensorBoard then drops the events the previous run wrote from this step
    on, so the curves show each step once. None on a fresh start."""
    step = first_step(rt, resumed_step)
    return step or None


def wandb_args(rt: _Run, *, rewind: bool = False, resumed_step: int | None = _UNSET) -> dict[str, Any]:
    """Keyword arguments for ``wandb.init``: the experiment id as the run id, ``resume="allow"``.

    Every run of the job logs into one W&B run. The steps logged after the checkpoint, before the stop, are then
    logged again by the resumed run; W&B ignores those (it warns that steps must increase) and keeps the old
    values. ``rewind=True`` asks W&B to cut the run's history back to the resumed step instead
    (``resume_from="<id>?_step=<first step>"``, W&B's rewind: SDK 0.17.1 or newer, and a server that has the
    feature, in preview). With an SDK without it, a warning says so and the plain resume is used."""
    run_id = rt.experiment_id
    step = first_step(rt, resumed_step)
    if not rewind or step == 0:
        return {"id": run_id, "resume": "allow"}
    if not _wandb_has_rewind():
        logger.warning("wandb_args(rewind=True): the installed wandb has no resume_from (rewinding needs wandb 0.17.1 "
                       "or newer); resuming W&B run %s without a rewind, so steps from %d on that the last run logged "
                       "keep their old values", run_id, step)
        return {"id": run_id, "resume": "allow"}
    return {"resume_from": f"{run_id}?_step={step}"}


def _wandb_has_rewind() -> bool:
    try:
        import wandb
    except ImportError:
        return False
    return "resume_from" in inspect.signature(wandb.init).parameters


def mlflow_run_id(rt: _Run) -> str | None:
    """The MLflow run id recorded next to the checkpoints by an earlier run of the experiment, or None."""
    directory = rt.options.checkpoint_dir
    if directory is None:
        return None
    value = read_trackers(directory).get("mlflow")
    return value if isinstance(value, str) else None


def mlflow_start_run(rt: _Run, **kwargs: Any) -> Any:
    """``mlflow.start_run`` for this experiment: the first run of the job creates the MLflow run (named after the
    experiment id, tagged ``slurmrt.experiment``) and records its id next to the checkpoints; every later run
    resumes it. Other keyword arguments go to ``mlflow.start_run``.

    MLflow cannot delete a metric's values from a step on: the steps the previous run logged after its last
    checkpoint stay in the history, next to the values the resumed run logs for them. Log the resumed step
    (:func:`first_step`) as a metric or a tag if your plots must cut them."""
    import mlflow

    directory = rt.options.checkpoint_dir
    run_id = mlflow_run_id(rt)
    if run_id is not None:
        try:
            return mlflow.start_run(run_id=run_id, **kwargs)
        except Exception as err:  # the training goes on without the old run rather than not at all
            # Seen: a run killed while MLflow's file store rewrote the run's meta.yaml in place leaves it unreadable.
            logger.warning("MLflow run %s of experiment %s cannot be resumed (%r): starting a new MLflow run, tagged "
                           "slurmrt.experiment=%s like the old one", run_id, rt.experiment_id, err, rt.experiment_id)
    tags = {"slurmrt.experiment": rt.experiment_id, **kwargs.pop("tags", {})}
    kwargs.setdefault("run_name", rt.experiment_id)
    run = mlflow.start_run(tags=tags, **kwargs)
    if directory is not None:
        remember_tracker(directory, "mlflow", run.info.run_id)
    else:
        logger.warning("no checkpoint directory: MLflow run %s cannot be resumed by a requeued run", run.info.run_id)
    return run



def goodput_metrics(rt: Any, prefix: str = "slurmrt/") -> dict[str, float]:
    """The job's goodput so far, every run of its event log included (the ledger of ``slurmrt status``), as flat
    metrics for the tracker run that spans the requeues: ``goodput`` (effective training time ratio),
    ``node_goodput`` when the node counts are known, and ``seconds/<category>`` for each category. Log them on rank
    0, at the end of a run or every so often (it reads the event log)::

        wandb.log(trackers.goodput_metrics(rt), step=step)
        mlflow.log_metrics(trackers.goodput_metrics(rt), step=step)

    Empty without an event log (no checkpoint directory and no ``event_log``)."""
    path = getattr(rt, "event_log", None)
    if path is None or not Path(path).exists():
        return {}
    ledger = account(read_events(Path(path), own=True))
    metrics = {f"{prefix}seconds/{category}": round(seconds, 3) for category, seconds in ledger.seconds.items()}
    if ledger.ettr is not None:
        metrics[f"{prefix}goodput"] = round(ledger.ettr, 6)
    if ledger.node_goodput is not None:
        metrics[f"{prefix}node_goodput"] = round(ledger.node_goodput, 6)
    return metrics
