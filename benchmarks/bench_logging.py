"""5. Logging under contention: 8 processes writing to one file through the flock handler, through a raw
fcntl.flock, through filelock, and with plain unsynchronised print; lines per second and damaged lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import ROOT, Section, table

WRITER = r"""
import logging, os, sys, time, fcntl
rank, mode, path, lines, start_at = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
os.environ["RANK"] = str(rank)
payload = chr(ord("a") + rank) * 200
import slurmrt.log
if mode == "handler":
    log = logging.getLogger("bench")
    slurmrt.log.install(logging.INFO, path=path, logger=log)
    log.handlers[0].setFormatter(logging.Formatter("%(message)s"))
elif mode == "stream":  # to stdout, a file as under srun: written at once when the lock is free
    os.environ["SLURMRT_LOCK_FILE"] = path + ".lock"
    sys.stdout = open(path, "a")
    log = logging.getLogger("bench")
    slurmrt.log.install(logging.INFO, logger=log)
    log.handlers[0].setFormatter(logging.Formatter("%(message)s"))
elif mode == "filehandler":  # Python's own, no lock: what the logging module costs by itself
    log = logging.getLogger("bench")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(f"[x:{rank}] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
time.sleep(max(0.0, start_at - time.time()))
t0 = time.perf_counter()
if mode in ("handler", "stream", "filehandler"):
    for i in range(lines):
        log.info("%s", payload)
    log.handlers[0].flush()  # the lines written behind are in the rate
elif mode == "fcntl":
    with open(path, "a") as f:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT)
        for i in range(lines):
            fcntl.flock(fd, fcntl.LOCK_EX)
            f.write(f"[x:{rank}] {payload}\n"); f.flush()
            fcntl.flock(fd, fcntl.LOCK_UN)
elif mode == "printflock":  # to a file of the caller's, which it may close next: each line is waited for
    with open(path, "a") as f:
        for i in range(lines):
            slurmrt.printflock(payload, file=f, lock_path=path + ".lock")
elif mode == "filelock":
    from filelock import FileLock
    lock = FileLock(path + ".lock")
    with open(path, "a") as f:
        for i in range(lines):
            with lock:
                f.write(f"[x:{rank}] {payload}\n"); f.flush()
else:  # print, unsynchronised, flushed in pieces as a busy buffered stream would
    with open(path, "a") as f:
        for i in range(lines):
            print(f"[x:{rank}] {payload[:100]}", end="", file=f, flush=True)
            print(payload[100:], file=f, flush=True)
print(time.perf_counter() - t0, file=sys.__stdout__)
"""
GOOD = re.compile(r"^\[[^\]]+:(\d)\] (.)\2{199}$")


MODES = (("print", "plain print, no lock"), ("handler", "slurmrt FlockHandler, its own file"),
         ("stream", "slurmrt FlockHandler, stdout"),
         ("printflock", "slurmrt.printflock, a file of the caller's"), ("fcntl", "raw fcntl.flock"),
         ("filelock", "filelock.FileLock"), ("filehandler", "logging.FileHandler, no lock"))


def _run(tmp: Path, mode: str, lines: int) -> tuple[float, int, int]:
    path = tmp / f"{mode}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start_at = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(r), mode, str(path), str(lines), start_at],
                              env=env, stdout=subprocess.PIPE, text=True) for r in range(8)]
    seconds = max(float(p.communicate(timeout=300)[0].strip()) for p in procs)
    text = path.read_text().splitlines()
    damaged = sum(1 for line in text if not GOOD.match(line))
    return 8 * lines / seconds, damaged, len(text)


def run(quick: bool = False) -> Section:
    lines = 2000 if quick else 10000
    rows = []
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, label in MODES:
            rate, damaged, total = _run(Path(tmp), mode, lines)
            figures[mode] = {"lines_per_s": rate, "damaged": damaged, "total": total}
            rows.append([label, f"{rate:,.0f}", f"{damaged} of {total}"])
    raw = figures["fcntl"]["lines_per_s"]
    for row, (mode, _) in zip(rows, MODES, strict=True):
        row.append(f"{figures[mode]['lines_per_s'] / raw:.2f}")
    body = table(["writer (8 processes)", "lines/s", "damaged lines", "of raw fcntl.flock"], rows)
    body += ("\n\n200-character lines to one file on the local disk, each process's lines flushed before its time is "
             "taken. The handler locks with a raw `fcntl.flock` on a file descriptor it keeps open: `filelock` opens "
             "and closes its lock file on every acquire, which costs more than the write itself at these rates. To "
             "its own file the handler writes behind: its lock's thread writes every line waiting in one hold of the "
             "lock and one `write`. To a stream (stdout under srun, shared with `print`) a line is written at once "
             "when the lock is free, under its own hold, and queued only when the lock is taken. To a file the "
             "caller opened (and may close next), the caller waits for its line: a taken lock is tried again "
             "between `sched_yield`s, then the line is queued and waited for. "
             "`logging.FileHandler` is Python's own handler without any lock: the logging module's cost per record "
             "(a LogRecord, the caller's frame, the formatting) is paid by every logging handler before it writes.")
    return Section("Logging under contention", body, figures)
