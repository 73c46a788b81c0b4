"""4. Checkpoint write and resume, side by side in one run on the same disk and the same bytes (1 GiB in 8 float32
tensors): the raw write of the tensors' memory with fsync, ``torch.save``, ``dcp.save`` and ``dcp.async_save``, and
slurmrt's blocking and non-blocking saves; the checksum's cost; resume time against state size.

One process: DTensors on a one-rank gloo mesh stand for sharded state (each rank of a real job writes its shards the
same way, in parallel with the others).
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ._common import ROOT, Section, free_port, table

_BLOCK = 8 << 20


def _raw(path: Path, state: dict[str, torch.Tensor], *, writeback: bool = False) -> None:
    """Zero-copy: os.write of each tensor's own memory, then fsync. With ``writeback``, the disk is asked to start on
    each block as soon as it is written (sync_file_range), as slurmrt's own writer does: the strongest raw writer."""
    from slurmrt.checkpoint._files import start_writeback

    start = start_writeback() if writeback else None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        for t in state.values():
            view = memoryview(t.numpy()).cast("B")
            for i in range(0, len(view), _BLOCK):
                n = os.write(fd, view[i:i + _BLOCK])
                if start is not None:
                    start(fd, offset, n)
                offset += n
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_threads(directory: Path, state: dict[str, torch.Tensor], threads: int = 4, *,
                 writeback: bool = False) -> None:
    """The raw write by ``threads`` writers, each its own file of a share of the tensors (as DCP's writer threads)."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(state)
    shares = [{k: state[k] for k in names[i::threads]} for i in range(threads)]
    directory.mkdir(exist_ok=True)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: _raw(directory / f"{i}.bin", shares[i], writeback=writeback), range(threads)))


#: The raw comparators of a per-rank save, by name: each writes the state into the directory it is given.
_RAW_WRITERS: dict[str, Callable[[Path, dict[str, torch.Tensor]], None]] = {
    "raw": lambda d, state: _raw(d / "raw.bin", state),
    "raw, 4 writer threads": lambda d, state: _raw_threads(d, state),
    "raw, 4 writer threads, early writeback": lambda d, state: _raw_threads(d, state, writeback=True),
}


def _torch_save(path: Path, state: dict[str, torch.Tensor]) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(quick: bool = False) -> Section:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from slurmrt.checkpoint._files import Hashing
    from slurmrt.checkpoint.background import NICE

    size = (256 if quick else 1024) << 20
    repeats = 3
    where = os.environ.get("SLURMRT_BENCH_DIR")
    base = Path(where) if where else Path(tempfile.mkdtemp(prefix="slurmrt-bench-", dir=ROOT / "benchmarks"))
    base.mkdir(parents=True, exist_ok=True)
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        # 2-D, as a model's weights are. (A 1-D DTensor shard of n elements costs DCP's planning an n-long int64
        # index in torch 2.13 -- compute_local_shape_and_global_offset's arange -- which made the DTensor saves
        # of 32M-element vectors look 3x slower than the same bytes as plain tensors.)
        plain = {f"layer{i}": torch.randn(size // 4 // 8 // 4096, 4096) for i in range(8)}
        sharded = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in plain.items()}
        fs = lambda p: dcp.FileSystemWriter(p, thread_count=4, sync_files=True)  # noqa: E731
        t: dict[str, list[float]] = {}

        def add(name: str, seconds: float) -> None:
            t.setdefault(name, []).append(seconds)

        def async_save(d: Path) -> None:
            t0 = time.perf_counter()
            future = dcp.async_save(sharded, storage_writer=fs(d / "dcp-async"))
            add("dcp.async_save: stall", time.perf_counter() - t0)
            future.result()
            add("dcp.async_save: until written", time.perf_counter() - t0)

        def checksum(d: Path) -> None:
            blob = b"".join(memoryview(v.numpy()).cast("B") for v in plain.values())

            class Null:
                def write(self, b: Any) -> int:
                    return len(b)

            add("checksum (XXH3-64 of the same bytes)", _timed(lambda: Hashing(Null()).write(blob)))

        turns = itertools.count()
        variants: list[Callable[[Path], None]] = [
            *(lambda d, name=name, w=w: add(name, _timed(lambda: w(d, plain))) for name, w in _RAW_WRITERS.items()),
            lambda d: add("torch.save", _timed(lambda: _torch_save(d / "t.pt", plain))),
            lambda d: add("dcp.save (tensors)", _timed(lambda: dcp.save(plain, storage_writer=fs(d / "dcp-plain")))),
            lambda d: add("dcp.save (DTensors)", _timed(lambda: dcp.save(sharded, storage_writer=fs(d / "dcp-dt")))),
            async_save,
            lambda d: _slurmrt_saves(d, plain, sharded, add, turns),
            checksum,
            _host_copy(plain, add),
        ]

        def one_round(d: Path, i: int) -> None:
            # Each round in another order: on a disk whose speed moves, no variant always follows the same one.
            # Each variant's files are deleted as soon as it is timed, as a run's pruning deletes old checkpoints:
            # on this machine's disk a write into blocks that were freed a moment ago took 0.5 s for 1 GiB, one into
            # blocks never written took 1.5 s, so files kept to the end of the round made each variant's time a
            # matter of where its blocks fell (the "moods" of earlier runs).
            for j, variant in enumerate(variants[i % len(variants):] + variants[:i % len(variants)]):
                vd = d / f"v{j}"
                vd.mkdir()
                os.sync()  # what one variant left for the kernel to write back is not charged to the next
                variant(vd)
                os.sync()
                shutil.rmtree(vd)

        for i in range(repeats):
            d = base / f"r{i}"
            d.mkdir()
            one_round(d, i)
            shutil.rmtree(d)
        order = [*_RAW_WRITERS, "torch.save", "dcp.save (tensors)", "dcp.save (DTensors)",
                 "dcp.async_save: stall", "dcp.async_save: until written"]
        m = {k: statistics.median(t[k]) for k in [*order, *(k for k in t if k not in order)]}
        gib = size / 2**30
        raw = min(m[k] for k in _RAW_WRITERS)  # the best raw writer of those bytes
        rows = [[k, f"{v:.2f}", f"{gib / v:.2f}" if not _not_a_write(k) else "-",
                 f"{raw / v * 100:.0f} % of the best raw" if not _not_a_write(k) else "-"]
                for k, v in m.items() if "dip" not in k and "pair" not in k]
        blocking = m["slurmrt blocking (DTensors, DCP)"]
        dt_saves = t["slurmrt blocking (DTensors, DCP)"]
        dips = t[f"dip, background save from the helper process at nice +{NICE}"]
        dips_before = t[f"dip, background save from threads at nice +{NICE}"]
        dip, dip_before = statistics.median(dips), statistics.median(dips_before)
        stall = m["slurmrt non-blocking (DTensors): stall"]
        background = m["slurmrt non-blocking (DTensors): until written"]
        in_background = m["slurmrt non-blocking (DTensors): in the background, until written"]
        checksum = m["checksum (XXH3-64 of the same bytes)"]
        copy_s = m["copy of the state into host buffers"]
        body = table(["what", "seconds (median)", "GiB/s", "throughput"], rows)
        gpu = _gpu(base, size, repeats)
        if gpu:
            body += "\n\n" + table(["GPU tensors (per-rank dict)", f"seconds (median of {repeats})", "relative"], gpu)
        resume = _resume(base, mesh, quick)
        body += "\n\n" + table(["state size", "save (s)", "load_latest(into=), verified (s)", "load, unverified (s)"],
                               resume)
        body += (f"\n\n{gib:.2f} GiB in 8 float32 tensors of 4096 columns, written to {base.parent}. DCP with 4 "
                 "writer threads, as slurmrt's saves (save_threads=4). Each variant ran once in each of "
                 f"{repeats} rounds; "
                 f"slurmrt's blocking saves are the {_WARM + 1}th to {_WARM + _TIMED}th "
                 "of one checkpoint directory with the default keep_last=3: each one prunes the oldest checkpoint "
                 "and writes into blocks an earlier pruning freed, as in a run's steady state, and, as in a run "
                 "where minutes pass between saves, the deletion of what the "
                 "save before pruned is over before the next is timed. The best raw writer is the fastest of one "
                 "thread, 4, and 4 that have the disk start on each 8 MiB as it is written. Each variant's files "
                 "are deleted as soon as it is timed (this disk writes freed blocks 3x faster than blocks never "
                 "written: kept files made each time depend on where its blocks fell). Ratios against the "
                 "DTensor save: non-blocking stall "
                 f"{stall / blocking * 100:.0f} % (target 5 %), {stall / copy_s:.2f}x the copy of the state into "
                 f"host buffers (the stall's floor, {copy_s:.3f} s), background write {background / blocking:.2f}x "
                 f"(target 1.3x; from the stall's end, while training goes on: {raw / in_background * 100:.0f} % of "
                 "the best raw writer, target 85 %), "
                 f"checksum {checksum / blocking * 100:.0f} % of the save time (target 10 %). "
                 f"slurmrt blocking (DTensors) against dcp.save (DTensors): "
                 f"{m['dcp.save (DTensors)'] / blocking * 100:.0f} % of the medians; of each save against a "
                 f"dcp.save of the same DTensors next to it ({len(t['pair: DTensors / dcp.save'])} pairs): "
                 f"{_spread(t['pair: DTensors / dcp.save'])}; the DTensor saves took {_range(dt_saves)} s, "
                 f"dcp.save of them {_range(t['dcp.save (DTensors)'])} s. "
                 f"The per-rank saves took {_range(t['slurmrt blocking (per-rank dict)'])} s; against 4 raw "
                 "writer threads next to it: "
                 f"{_spread(t['pair: per-rank dict / raw 4 threads'])}; against 4 raw writer threads with early "
                 f"writeback next to it: {_spread(t['pair: per-rank dict / raw 4 threads, early writeback'])}. "
                 "Throughput dip: how many fewer steps a loop of "
                 "1 ms busy-Python steps ran while a background save ran (its write, commit and pruning), than "
                 f"right after for as long: written by slurmrt's save helper process at nice +{NICE} (the "
                 f"default) {_spread(dips)}, target 10 %; by threads of the loop's own process at nice +{NICE} (as "
                 f"before the helper), in the same run, {_spread(dips_before)}. Loop and save share this "
                 "machine's 2 cores.")
        figures = {"raw_s": raw, "blocking_dcp_s": blocking, "stall_ratio": stall / blocking,
                   "stall_per_copy": stall / copy_s,
                   "background_ratio": background / blocking,
                   "background_raw_ratio": raw / in_background, "checksum_ratio": checksum / blocking,
                   "throughput_ratio_state": raw / m["slurmrt blocking (per-rank dict)"],
                   "throughput_ratio_dcp": raw / blocking, "dip": dip, "dip_threads": dip_before,
                   "pairs_dcp": t["pair: DTensors / dcp.save"], "pairs_raw": t["pair: per-rank dict / raw 4 threads"],
                   "pairs_raw_writeback": t["pair: per-rank dict / raw 4 threads, early writeback"]}
        return Section("Checkpoint write and resume", body, figures)
    finally:
        if own_group:
            dist.destroy_process_group()
        if not where:
            shutil.rmtree(base, ignore_errors=True)


def _side_by_side(d: Path, save: Callable[[], Any], comparators: dict[str, Callable[[Path], Any]],
                  turn: int, settle: Callable[[], Any]) -> dict[str, float]:
    """The seconds of ``save`` and of each comparator, one after the other in an order turned by ``turn``, each after
    ``settle()`` and an ``os.sync``; a comparator's files are deleted as soon as it is timed. ``settle`` waits for the
    store's deletion of the checkpoint its last save pruned: that runs on a thread of its own, off the save's
    critical path, and in a run it is over long before the next save, minutes later. Here the next save comes within
    a second, and would otherwise write while those blocks are not yet free (3x slower on this disk)."""
    names = ["save", *comparators]
    names = names[turn % len(names):] + names[:turn % len(names)]
    out = {}
    for name in names:
        settle()
        os.sync()
        if name == "save":
            out[name] = _timed(save)
            continue
        where = d / "comparator"
        where.mkdir()
        out[name] = _timed(lambda: comparators[name](where))  # noqa: B023 - called at once
        shutil.rmtree(where)
    return out


#: Saves of one checkpoint directory before the timed ones: with the default keep_last=3, the last 3 of them have
#: each pruned a checkpoint, whose blocks the file system hands to the next save, as in a run's steady state. (After
#: only 3, the first timed save wrote into blocks never written, 3x slower on this disk, and its comparator next to it
#: into the blocks the comparator before had freed.)
_WARM = 6

#: Timed saves of each store in each round, each paired with its comparators. This disk has a slow mood about one
#: save in eight to twelve, whoever writes (a save after another writer's files were deleted took 0.75-1.2 s against
#: 0.45 s, with or without slurmrt's writeback hint): with 2 timed saves a round, 6 in a run, two such moods moved the
#: median by half. 4 a round, 12 in a run.
_TIMED = 4


def _slurmrt_saves(d: Path, plain: dict[str, Any], sharded: dict[str, Any], add: Callable[[str, float], None],
                   turns: Iterator[int]) -> None:
    import torch.distributed.checkpoint as dcp

    from slurmrt._comm import SoloComm
    from slurmrt.checkpoint.background import NICE as nice
    from slurmrt.checkpoint.store import CheckpointStore, SaveResult

    # As a run saves: the default keep_last=3, so from the fourth save on each one prunes the oldest.
    # Each of the timed saves is compared with its comparators right next to it, in an order that turns from one
    # comparison to the next, on bytes the disk sees in the same moment; the pairs' ratios are reported besides the
    # medians.
    raw = {k: (lambda w, k=k: _RAW_WRITERS[k](w, plain)) for k in _RAW_WRITERS if k != "raw"}
    store = CheckpointStore(d / "srt-state", SoloComm())
    for step in range(1, _WARM + _TIMED + 1):
        if step > _WARM:
            got = _side_by_side(d, lambda: store.save(plain, step), raw, next(turns),  # noqa: B023 - at once
                                store.retention.join_deletions)
            add("slurmrt blocking (per-rank dict)", got["save"])
            add("pair: per-rank dict / raw 4 threads", got["raw, 4 writer threads"] / got["save"])
            add("pair: per-rank dict / raw 4 threads, early writeback",
                got["raw, 4 writer threads, early writeback"] / got["save"])
        else:
            store.save(plain, step)
    store.close()
    store = CheckpointStore(d / "srt-dcp", SoloComm())
    writer = lambda p: dcp.FileSystemWriter(p, thread_count=4, sync_files=True)  # noqa: E731
    dcp_save = {"dcp.save": lambda w: dcp.save(sharded, storage_writer=writer(w))}
    for step in range(1, _WARM + _TIMED + 1):
        if step > _WARM:
            got = _side_by_side(d, lambda: store.save(sharded, step), dcp_save, next(turns),  # noqa: B023 - at once
                                store.retention.join_deletions)
            add("slurmrt blocking (DTensors, DCP)", got["save"])
            add("pair: DTensors / dcp.save", got["dcp.save"] / got["save"])
        else:
            store.save(sharded, step)
    # Non-blocking: _TIMED saves of one store after its first (the first allocates the host buffers it reuses), by
    # the save helper (started now: in a run the saves before it is ready are written by threads).
    if store.helper is not None:
        store.helper.start()
    for step in range(_WARM + _TIMED + 1, _WARM + 2 * _TIMED + 2):
        store.retention.join_deletions()  # as before each blocking save: in a run, minutes pass between saves
        os.sync()
        t0 = time.perf_counter()
        store.save(sharded, step, blocking=False)
        stall = time.perf_counter() - t0
        store.wait()
        if step > _WARM + _TIMED + 1:
            add("slurmrt non-blocking (DTensors): stall", stall)
            written = time.perf_counter() - t0
            add("slurmrt non-blocking (DTensors): until written", written)
            # The background's own part: what runs while training goes on.
            add("slurmrt non-blocking (DTensors): in the background, until written", written - stall)
    # The throughput dip: a busy-Python training loop while the background save runs (its write, its commit and
    # the deletion of the checkpoint it pruned), against the same loop right after for as long without one. The
    # save written by slurmrt's helper process (the default), and, for comparison in the same run, by threads of
    # the loop's own process (as before the helper), both at slurmrt's lowered priority.
    helper = store.helper
    for step in range(_WARM + 2 * _TIMED + 2, _WARM + 2 * _TIMED + 6):
        store.helper = None if step % 2 else helper
        pending = store.save(sharded, step, blocking=False)
        assert not isinstance(pending, SaveResult)
        steps, seconds = _busy_loop(lambda: pending.done() and not store.retention.deleting())  # noqa: B023
        store.wait()
        store.retention.join_deletions()
        os.sync()
        alone, alone_s = _busy_loop(lambda: False, seconds)  # noqa: B023 - called at once
        which = f"from threads at nice +{nice}" if step % 2 else f"from the helper process at nice +{nice}"
        add(f"dip, background save {which}", 1 - (steps / seconds) / (alone / alone_s))
    store.helper = helper
    store.close()


def _host_copy(plain: dict[str, torch.Tensor], add: Callable[[str, float], None]) -> Callable[[Path], None]:
    """The stall's floor: the copy of the state into host buffers that already exist (as the non-blocking save's,
    reused from one save to the next), one tensor after the other."""
    buffers = {k: torch.empty_like(v) for k, v in plain.items()}
    for k, v in plain.items():
        buffers[k].copy_(v)

    def host_copy(d: Path) -> None:
        add("copy of the state into host buffers", _timed(lambda: [buffers[k].copy_(v) for k, v in plain.items()]))

    return host_copy


def _not_a_write(name: str) -> bool:
    return "stall" in name or "checksum" in name or "copy" in name


def _spread(ratios: list[float]) -> str:
    ordered = sorted(ratios)
    return f"median {statistics.median(ordered) * 100:.0f} % ({ordered[0] * 100:.0f}-{ordered[-1] * 100:.0f} %)"


def _range(seconds: list[float]) -> str:
    return f"{min(seconds):.2f}-{max(seconds):.2f}"


def _busy_step() -> int:
    """About a millisecond of Python holding the GIL, as a training loop that launches kernels does."""
    total = 0
    for i in range(12_000):
        total += i * i
    return total


def _busy_loop(done: Callable[[], bool], seconds: float | None = None) -> tuple[int, float]:
    """Steps until ``done()`` (or for ``seconds``): how many, in how long."""
    t0 = time.perf_counter()
    steps = 0
    while not done() and (seconds is None or time.perf_counter() - t0 < seconds):
        _busy_step()
        steps += 1
    return steps, time.perf_counter() - t0


def _resume(base: Path, mesh: Any, quick: bool) -> list[list[str]]:
    from torch.distributed.tensor import Shard, distribute_tensor

    from slurmrt._comm import SoloComm
    from slurmrt.checkpoint.store import CheckpointStore

    rows = []
    for mib in (64, 256) if quick else (64, 256, 1024):
        state = {f"layer{i}": distribute_tensor(torch.randn((mib << 20) // 4 // 8 // 4096, 4096), mesh, [Shard(0)])
                 for i in range(8)}
        store = CheckpointStore(base / f"resume-{mib}", SoloComm(), keep_last=1)
        save = _timed(lambda: store.save(state, 1))  # noqa: B023
        into = {k: distribute_tensor(torch.empty_like(v.to_local()), mesh, [Shard(0)]) for k, v in state.items()}
        verified = _timed(lambda: store.load_latest(into=into))  # noqa: B023
        assert all(torch.equal(into[k].to_local(), state[k].to_local()) for k in state)
        unverified = _timed(lambda: store.load_latest(into=into, verify=False))  # noqa: B023
        rows.append([f"{mib} MiB", f"{save:.2f}", f"{verified:.2f}", f"{unverified:.2f}"])
        shutil.rmtree(base / f"resume-{mib}")
    return rows


def _gpu(base: Path, size: int, repeats: int) -> list[list[str]]:
    """With CUDA: the same bytes on the GPU, saved blocking and non-blocking (the snapshot is a device-to-host copy
    into pinned buffers kept from one save to the next). Nothing without CUDA."""
    if not torch.cuda.is_available():
        return []
    from slurmrt._comm import SoloComm
    from slurmrt.checkpoint.store import CheckpointStore

    state = {f"layer{i}": torch.randn(size // 4 // 8, device="cuda") for i in range(8)}
    store = CheckpointStore(base / "gpu", SoloComm(), keep_last=1)
    blocking, stall, background = [], [], []
    for i in range(repeats + 1):
        blocking.append(_timed(lambda: store.save(state, 2 * i)))  # noqa: B023
        t0 = time.perf_counter()
        store.save(state, 2 * i + 1, blocking=False)
        stall.append(time.perf_counter() - t0)
        store.wait()
        background.append(time.perf_counter() - t0)
    b, st, bg = (statistics.median(x[1:]) for x in (blocking, stall, background))  # the first allocates
    shutil.rmtree(base / "gpu", ignore_errors=True)
    return [["slurmrt blocking", f"{b:.2f}", "100 %"],
            ["slurmrt non-blocking: stall", f"{st:.3f}", f"{st / b * 100:.1f} % of the blocking save"],
            ["slurmrt non-blocking: until written", f"{bg:.2f}", f"{bg / b:.2f}x the blocking save"]]
