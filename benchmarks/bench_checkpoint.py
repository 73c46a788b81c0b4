"""4. Checkpoint write: a blocking save of a 1 GiB state against a plain sequential write of the same bytes with
fsync (dd-style) on the same disk; and the training stall of a non-blocking save against the blocking one."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from slurmrt._comm import SoloComm
from slurmrt.checkpoint.store import CheckpointStore

from ._common import ROOT, Section, table


def _dd(path: Path, data: bytes, block: int = 8 << 20) -> float:
    view = memoryview(data)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, len(view), block):
            os.write(fd, view[i:i + block])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def run(quick: bool = False) -> Section:
    size = (256 if quick else 1024) << 20
    repeats = 3
    where = os.environ.get("SLURMRT_BENCH_DIR")
    base = Path(where) if where else Path(tempfile.mkdtemp(prefix="slurmrt-bench-", dir=ROOT / "benchmarks"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        state = {"model": torch.randn(size // 4 // 8), **{f"layer{i}": torch.randn(size // 4 // 8) for i in range(7)}}
        raw = b"".join(t.numpy().tobytes() for t in state.values())
        dd_s, blocking_s, stall_s, total_nb_s = [], [], [], []
        for i in range(repeats):
            dd_s.append(_dd(base / f"dd-{i}.bin", raw))
            (base / f"dd-{i}.bin").unlink()
            store = CheckpointStore(base / f"ckpt-{i}", SoloComm(), keep_last=1)
            t0 = time.perf_counter()
            store.save(state, 2 * i)
            blocking_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.save(state, 2 * i + 1, blocking=False)
            stall_s.append(time.perf_counter() - t0)
            store.wait()
            total_nb_s.append(time.perf_counter() - t0)
            shutil.rmtree(base / f"ckpt-{i}")
        dd, blocking, stall = statistics.median(dd_s), statistics.median(blocking_s), statistics.median(stall_s)
        gib = len(raw) / 2**30
        rows = [
            ["plain write + fsync (dd-style)", f"{dd:.2f}", f"{gib / dd:.2f}", "100 %"],
            ["slurmrt blocking save", f"{blocking:.2f}", f"{gib / blocking:.2f}", f"{dd / blocking * 100:.0f} %"],
            ["slurmrt non-blocking save: training stall", f"{stall:.2f}", "-",
             f"{stall / blocking * 100:.0f} % of the blocking save"],
            ["slurmrt non-blocking save: until written", f"{statistics.median(total_nb_s):.2f}", "-", "-"],
        ]
        body = table(["what", "seconds (median of 3)", "GiB/s", "relative"], rows)
        body += (f"\n\n{gib:.2f} GiB state of 8 float32 tensors, written to {base.parent} (local disk). Targets: "
                 "blocking save >= 80 % of the plain write; non-blocking stall <= 10 % of the blocking save.")
        figures = {"dd_s": dd, "blocking_s": blocking, "stall_s": stall, "throughput_ratio": dd / blocking,
                   "stall_ratio": stall / blocking}
        return Section("Checkpoint write", body, figures)
    finally:
        shutil.rmtree(base, ignore_errors=True)
