"""The simulator's process plumbing: it is the child subreaper of everything it starts, and reaps and kills what is
left, without stealing the exit status of a child a ``Popen`` still waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

import psutil

__all__ = ["become_subreaper", "descendants", "family", "keep", "reap", "release", "run_ns"]

_PR_SET_CHILD_SUBREAPER = 36
_KEEP: set[int] = set()  # children whose exit status a Popen object still has to collect


def keep(pid: int) -> None:
    """``pid``'s exit status is a ``Popen``'s to collect: :func:`reap` leaves it alone."""
    _KEEP.add(pid)


def release(pid: int) -> None:
    _KEEP.discard(pid)


def become_subreaper() -> None:
    # Orphans (a task whose wrapper died, a daemonised helper) come back to us instead of init, so they are found
    # and killed at the end of a run.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants() -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def family(pids: list[int]) -> list[int]:
    """The processes ``pids`` and all their descendants that are alive."""
    found = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            found += [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            continue
    return found


def run_ns(pid: int) -> int:
    """The CPU time ``pid``'s main thread has run, in ns (``/proc/PID/schedstat``; the user and system times, in
    clock ticks, where the kernel keeps no schedstat); 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except FileNotFoundError:
        pass  # gone, or a kernel without schedstat
    except (OSError, ValueError, IndexError):
        return 0
    try:
        t = psutil.Process(pid).cpu_times()
        return round((t.user + t.system) * 1e9)
    except psutil.Error:
        return 0


def reap() -> None:
    """Collect orphans that died after being re-parented to us; never a child a Popen still waits for (waitpid(-1)
    would steal its exit status, and Popen would then report 0)."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in _KEEP:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass
