"""The options, in the sections of the parts that use them: each field is an ``init()`` keyword argument and a
``SLURMRT_<NAME>`` variable (docs/reference/environment.md), declared once with its default and its rule.

:class:`slurmrt.options.Options` is their composition; each part takes the settings it uses, picked from it
(``StopSettings``, ``CheckpointSettings``, ``HangSettings``, the recovery's ``Facts``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ._rules import Rule, setting
from .launch.parallel import ParallelConfig
from .stop.signals import DEFAULT_SIGNALS

__all__ = ["SECTIONS", "CheckpointSection", "HangSection", "LaunchSection", "RecordSection", "RecoverySection",
           "StopSection"]


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    """Checkpoints: where, how many, how they are written, whose files are trusted, and the cadence's prior."""

    #: Where checkpoints go; a directory every node sees. Required for save() and load_latest().
    checkpoint_dir: Path | None = setting(None, "path")
    keep_last: int = setting(3, "count", least=1)
    #: A node-local directory (``/dev/shm``, ``$SLURM_TMPDIR``, an NVMe path) for ``save(..., tier="local")``: fast
    #: saves each kept on the node and on a partner node. None: no local tier.
    local_checkpoint_dir: Path | None = setting(None, "path")
    #: Steps the local tier keeps on each node (each its own parts and the partner's replicas).
    local_keep: int = setting(2, "count", least=1)
    #: Milestones: a checkpoint whose step is a multiple of this is never pruned. None: no milestones.
    keep_every: int | None = setting(None, "count", least=1, optional=True)
    #: Threads that write (and checksum) one rank's part of a checkpoint.
    save_threads: int = setting(4, "count", least=1)
    #: How much lower than the training's the CPU priority of a background save's write is (a nice increment,
    #: 0-19; Linux). 0: the training's own.
    save_nice: int = setting(10, "count")
    #: Write background saves from a helper process (its own GIL, at ``save_nice``) fed from shared memory, not from
    #: threads of the training process (Linux; elsewhere threads). See ``slurmrt.checkpoint.helper``.
    save_process: bool = setting(True, "flag")
    #: A group whose checkpoint files this job trusts and loads (a name or a gid): by default only files of this
    #: user's (or root's) are unpickled. See ``slurmrt.checkpoint.trust``.
    trusted_group: str | None = setting(None, "group")
    #: The checkpoint directory is shared with other users on purpose: its mode (``o+w``) is not refused.
    shared_checkpoint_dir: bool = setting(False, "flag")
    #: ``rt.should_save``'s prior: one failure in this many node-hours (Llama 3's run had about one in 5,700), until
    #: the experiment's own history says more (slurmrt.checkpoint.cadence).
    mtbf_node_h: float = setting(5000.0, "hours", least=0.001)


@dataclass(frozen=True, kw_only=True)
class StopSection:
    """An agreed stop: the signals, the deadline, the kill switch, what paces the watcher, and stragglers."""

    signals: tuple[signal.Signals, ...] = setting(DEFAULT_SIGNALS, "signals")
    #: A path anyone may create to stop the job (or every task of an array) cleanly, without requeue.
    kill_switch: Path | None = setting(None, "path")
    deadline: bool = setting(True, "flag")
    #: Safety margin kept free before the job's end time, on top of the steps and the save.
    deadline_margin_s: float = setting(30.0, "seconds")
    #: Save time assumed until one has been measured.
    save_time_s: float = setting(30.0, "seconds")
    #: Slurm's KillWait: time between SIGTERM and SIGKILL.
    kill_wait_s: float = setting(30.0, "seconds")
    #: How often the watcher thread looks at what may stop or end the run between two steps: the kill switch, the
    #: job's end time, the lease's heartbeat and the hang watchdog. (Was ``kill_switch_poll_s``.)
    watch_interval_s: float = setting(5.0, "seconds", least=0.01)
    end_time_refresh_s: float = setting(900.0, "seconds", least=1.0)
    #: Rank 0 records its step in the event log this often (the timeline of ``slurmrt status``, ``slurmrt sim``).
    #: At least 1 s: a sample under a second wrote an event per step (2,583 events in 3 s).
    progress_s: float | None = setting(10.0, "seconds", least=1.0, optional=True)
    #: What a rank named a straggler (slurmrt.stop.straggler; measured by ``rt.time_compute()``) costs its node:
    #: "name" (the log, the event log, ``slurmrt status``), "exclude" (also left out at the next in-job restart or
    #: requeue, whatever causes it) or "replace" (also a stop now, a save, and a restart without the node: a new
    #: step on a spare under ``slurmrt run``, else a requeue with it excluded).
    straggler: str = setting("name", "choice", choices=("name", "exclude", "replace"))
    #: A straggler's timed section is at least 1 + this times the slowest rank's on the other nodes ...
    straggler_margin: float = setting(0.25, "fraction")
    #: ... in each of ``straggler_windows`` windows in a row, of ``straggler_window`` timed steps each.
    straggler_window: int = setting(20, "count", least=2)
    straggler_windows: int = setting(3, "count", least=1)


@dataclass(frozen=True, kw_only=True)
class HangSection:
    """The hang watchdog (slurmrt.hang.watchdog), its census, and the node's health check."""

    #: On by default.
    watchdog: bool = setting(True, "flag")
    #: A fixed allowance for one training step; None: learned from the measured steps (10x the slowest recent one).
    hang_timeout_s: float | None = setting(None, "seconds", least=0.01, optional=True)
    #: The least allowance the watchdog ever gives a step, a save, a load or a phase.
    hang_floor_s: float = setting(180.0, "seconds", least=0.01)
    #: The allowance from init() to the end of the warm-up steps, and for a phase never measured.
    startup_timeout_s: float = setting(1200.0, "seconds", least=0.01)
    #: How long a hang's census waits for every rank's answer; None: 3 watch intervals, at least 10 s.
    census_wait_s: float | None = setting(None, "seconds", least=0.01, optional=True)
    #: Check the node at start-up (CUDA, /dev/shm, the checkpoint directory) and the communication at the first
    #: collective; a failed check excludes the node and requeues the job.
    health_check: bool = setting(False, "flag")


@dataclass(frozen=True, kw_only=True)
class RecoverySection:
    """The recovery's policy: whether and how often the job comes back, and how many nodes it may leave out."""

    requeue: bool = setting(True, "flag")
    max_restarts: int | None = setting(None, "count", optional=True)
    #: Stop requeueing after this many runs in a row committed no newer checkpoint. None: never stop.
    max_futile_runs: int | None = setting(3, "count", least=1, optional=True)
    #: At most this many nodes excluded from the job by slurmrt, over all its runs.
    max_excluded_nodes: int = setting(4, "count")


@dataclass(frozen=True, kw_only=True)
class RecordSection:
    """What the job records: its event log, its experiment, its log lines, its goodput for Prometheus."""

    event_log: Path | None = setting(None, "path")
    #: The experiment id: by default the one stored next to the checkpoints (new for a fresh directory).
    experiment_id: str | None = setting(None, "value")
    #: slurmrt's own log lines (the ``slurmrt`` logger) get a handler of their own at init(): time, level and
    #: ``[host:rank]``, INFO on rank 0 and warnings on every rank, under the job's flock. Skipped when the program
    #: configured logging first (the root logger or ``slurmrt`` has a handler). False: never.
    log_handler: bool = setting(True, "flag")
    #: Rank 0 writes the job's goodput (``slurmrt status``'s ledger) here as OpenMetrics text at the end of each
    #: run, replaced whole: for Prometheus' textfile collector. None: not written.
    metrics_file: Path | None = setting(None, "path")


@dataclass(frozen=True, kw_only=True)
class LaunchSection:
    """The job's declared shape, for the launch checks and the CUDA rule."""

    #: Its fields are init() options of their own (``tp=2``, ``SLURMRT_TP``), and so is ``megatron_args``,
    #: Megatron-LM's command line, read in their place.
    parallel: ParallelConfig = setting(None, "value", factory=ParallelConfig)
    #: The rules of the shape's own options.
    SHAPE: ClassVar[dict[str, Rule]] = {
        "nnodes": Rule("count", 1), "gpus_per_node": Rule("count"), "tp": Rule("count", 1), "pp": Rule("count", 1),
        "cp": Rule("count", 1), "fsdp": Rule("flag"), "moe_overlap": Rule("flag"), "megatron_args": Rule("argv")}


#: Every section, in the order of the options' documentation.
SECTIONS = (CheckpointSection, StopSection, HangSection, RecoverySection, RecordSection, LaunchSection)
