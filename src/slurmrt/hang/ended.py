"""What srun saw end, as a hang's response reads it (under ``slurmrt run``, with one task per rank).

A task that ended on a signal or an error is a *lost* peer: it will never answer the census, and a rank that waits
for it waits in vain. A task that ended on an exit code of slurmrt's own answer (a stop, a requeue, a hang's or a
lost peer's response: :data:`ANSWERED`) made the job's answer already: the step comes down next, and a rank still
stalled in a step can only be waiting for that peer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..recovery.policy import ExitCode

__all__ = ["ANSWERED", "SeenEnded", "describe"]

#: How srun says a task ended on an answer of slurmrt's own (a stop, a requeue, a hang's response), which every rank
#: takes: not a lost peer.
ANSWERED = frozenset(f"Exited with exit code {int(c)}" for c in ExitCode if c not in (ExitCode.FINISHED,
                                                                                      ExitCode.FAILED))

#: rank -> (node, how srun said it ended)
Ended = dict[int, tuple[str, str]]


class SeenEnded:
    """The tasks srun saw end, through ``read``: :class:`~slurmrt.recovery.injob.EndedReader`, which reads at most
    twice a second and keeps its last reading in ``last``."""

    def __init__(self, read: Callable[[], Ended]) -> None:
        self._read = read

    def __call__(self) -> Ended:
        return self._read()

    @property
    def last(self) -> Ended:
        """The last reading, without reading again (nothing before the first)."""
        last: Ended = getattr(self._read, "last", {})
        return last

    def lost(self, me: int) -> Ended:
        """The peers (not ``me``) that srun saw end on a signal or an error: lost."""
        return {r: e for r, e in self().items() if r != me and e[1] not in ANSWERED}

    def answered(self, me: int) -> Ended:
        """The peers (not ``me``) that srun saw end on an answer of slurmrt's own."""
        return {r: e for r, e in self().items() if r != me and e[1] in ANSWERED}

    def among(self, suspects: list[int], answered: Mapping[int, object]) -> Ended:
        """The suspects that never answered the census (not in ``answered``) and whose task srun saw end, from the
        last reading."""
        seen = self.last
        return {r: seen[r] for r in suspects if r not in answered and r in seen}

    def saying(self, suspects: list[int], answered: Mapping[int, object]) -> str:
        """"; srun saw rank R end (how, on node)", for :meth:`among`'s; empty when none."""
        ended = [f"rank {r} end ({how}, on {node})" for r, (node, how) in self.among(suspects, answered).items()]
        return "; srun saw " + ", ".join(ended) if ended else ""

    def all_lost(self, suspects: list[int], answered: Mapping[int, object]) -> bool:
        """Whether srun saw every suspect's task end, on a signal or an error (not an answer of slurmrt's own)."""
        ended = self.among(suspects, answered)
        return bool(suspects) and len(ended) == len(set(suspects)) and \
            all(how not in ANSWERED for _, how in ended.values())


def describe(ended: Ended) -> str:
    """"rank R (how, on node), ..." in rank order."""
    return ", ".join(f"rank {r} ({how}, on {node})" for r, (node, how) in sorted(ended.items()))
