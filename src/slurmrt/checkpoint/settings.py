"""Checkpoints' options: declared here once, each an ``init()`` keyword and a ``SLURMRT_<NAME>`` variable
(docs/reference/environment.md); :class:`slurmrt.options.Options` composes the sections, and the composer hands this
one to the checkpoint session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .._rules import Section, setting

__all__ = ["CheckpointSection"]


@dataclass(frozen=True, kw_only=True)
class CheckpointSection(Section):
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
