"""What only a GPU can show: the CUDA connections rule before any CUDA context, NCCL, GPU tensors saved and loaded
bit for bit (whole, in the background through the helper process, sharded through DCP), and the framework examples
trained on the GPU through a preemption.

Skipped without CUDA (CI has none). On a GPU machine: ``python -m pytest tests/gpu`` (``make test-gpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"), pytest.mark.timeout(600)]


def python(code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None
           ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    full.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    full.update({"PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}, **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def sim(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    full.update({"PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                **(env or {}))
    return subprocess.run([sys.executable, "-m", "slurmrt", "sim", *args], cwd=tmp, env=full, capture_output=True,
                          text=True, timeout=500)


def test_the_rule_reads_the_architecture_from_nvml_and_sets_one_connection_before_cuda_starts() -> None:
    out = python("""
        import json, torch
        from slurmrt.launch import cuda
        from slurmrt.launch.parallel import ParallelConfig
        import os
        arch, gpus = cuda.gpu_arch_major(), cuda.node_gpu_count(os.environ)
        untouched = not torch.cuda.is_initialized()  # NVML only: no CUDA context yet
        value = cuda.apply(os.environ, arch, ParallelConfig(tp=2))
        torch.ones(1, device="cuda")  # the context starts now, with the variable already set
        print(json.dumps({"arch": arch, "gpus": gpus, "untouched": untouched, "value": value,
                          "env": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                          "capability": torch.cuda.get_device_capability(0), "name": torch.cuda.get_device_name(0),
                          "fsdp": cuda.max_connections(arch, tp=2, fsdp=True),
                          "moe": cuda.max_connections(arch, tp=2, moe_overlap=True)}))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    print(got)
    assert got["arch"] == got["capability"][0] and got["gpus"] >= 1 and got["untouched"]
    if got["arch"] < 10:  # Hopper and older: one connection with TP > 1
        assert got["value"] == got["env"] == "1"
    else:  # Blackwell: left alone
        assert got["value"] is None and got["env"] is None
    assert got["fsdp"] is None and got["moe"] == "32"


def test_a_cuda_context_made_first_is_refused_with_the_fix() -> None:
    out = python("""
        import os, torch
        from slurmrt.launch import cuda
        from slurmrt.launch.parallel import ParallelConfig
        torch.ones(1, device="cuda")
        try:
            cuda.apply(os.environ, 9, ParallelConfig(tp=2))
        except Exception as err:
            print(type(err).__name__, err)
    """)
    assert "CudaInitializedError" in out.stdout and "call slurmrt.init() before" in out.stdout, out.stdout + out.stderr


def test_init_with_tp_2_exports_one_connection_before_cuda() -> None:
    """The whole init() path: TP=2 needs two ranks; they share the one GPU as two one-rank nodes (two local ranks
    on one GPU are refused, rightly: NCCL would find a duplicate GPU)."""
    code = """
        import json, os, slurmrt, torch
        rt = slurmrt.init(tp=2, checkpoint_dir=None)
        before = torch.cuda.is_initialized()
        torch.ones(1, device="cuda")
        print(json.dumps({"rank": rt.rank, "set": rt.cuda_device_max_connections, "before": before,
                          "env": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}))
        rt.close()
    """
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_DEVICE_MAX"))}
        env.update({"PYTHONPATH": str(ROOT / "src"), "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": "29533"})
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs, strict=True):
        assert p.returncode == 0, stderr[-3000:]
        got = json.loads(stdout.splitlines()[-1])
        assert got["set"] == got["env"] == "1" and got["before"] is False, got


def test_nccl_and_gpu_tensors_saved_whole_in_the_background_and_sharded_come_back_bit_for_bit(tmp_path: Path
                                                                                               ) -> None:
    out = python(f"""
        import json, os, time, torch, torch.distributed as dist
        import slurmrt
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
        rt = slurmrt.init(checkpoint_dir={str(tmp_path / "ckpt")!r})
        dist.init_process_group("nccl")
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        dist.all_reduce(x)
        assert torch.equal(x, torch.arange(1 << 20, device="cuda", dtype=torch.float32))
        g = torch.Generator(device="cuda").manual_seed(1)
        state = {{"w": torch.randn(64 << 20, device="cuda", generator=g),  # 256 MiB
                  "h": torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16), "step": 1}}
        t0 = time.monotonic(); rt.save(state, step=1); blocking = time.monotonic() - t0
        later = {{k: (v + 1 if torch.is_tensor(v) else v) for k, v in state.items()}}
        t0 = time.monotonic(); rt.save(later, step=2, blocking=False); stall = time.monotonic() - t0
        rt.checkpoints.wait()
        step, got = rt.load_latest()
        same = step == 2 and all(torch.equal(got[k].cuda(), later[k]) for k in ("w", "h"))
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = init_device_mesh("cuda", (1,))
        sharded = {{"model": {{"w": distribute_tensor(state["w"][: 1 << 20].clone(), mesh, [Shard(0)])}}}}
        rt.save(sharded, step=3)
        into = {{"model": {{"w": distribute_tensor(torch.zeros(1 << 20, device="cuda"), mesh, [Shard(0)])}}}}
        step3, _ = rt.load_latest(into=into)
        dcp = step3 == 3 and torch.equal(into["model"]["w"].full_tensor(), state["w"][: 1 << 20])
        print(json.dumps({{"nccl": dist.get_backend(), "same": bool(same), "dcp": bool(dcp), "blocking_s": blocking,
                          "background_stall_s": stall, "device": torch.cuda.get_device_name(0),
                          "loaded_on": str(got["w"].device)}}))
        rt.exit()
    """)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    print(got)
    assert got["nccl"] == "nccl" and got["same"] and got["dcp"]
    subprocess.run([sys.executable, "-m", "slurmrt", "verify", str(tmp_path / "ckpt")], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def _weights(path: Path) -> dict[str, object]:
    return dict(torch.load(path, map_location="cpu"))


EXAMPLES = {
    "accelerate": (["examples/accelerate/train.py", "--steps", "80", "--save-every", "20", "--step-time", "0.05"],
                   "--steps"),
    "lightning": (["examples/lightning/train.py", "--steps", "40", "--save-every", "10", "--step-time", "0.1"],
                  "--steps"),
    "transformers": (["examples/transformers/train.py", "--steps", "40", "--save-steps", "10", "--step-time", "0.1",
                      "--output-dir", "out"], "--steps"),
}


@pytest.mark.parametrize("framework", sorted(EXAMPLES))
def test_the_example_trains_on_the_gpu_through_a_preemption_to_the_uninterrupted_weights(framework: str,
                                                                                         tmp_path: Path) -> None:
    pytest.importorskip(framework)
    args, _ = EXAMPLES[framework]
    runs = {}
    for name, faults in (("reference", []), ("preempted", ["--preempt-at", "0", "--after-checkpoint", "--signal",
                                                           "USR1", "--grace", "60", "--requeue"])):
        d = tmp_path / name
        d.mkdir()
        out = sim(d, "-N", "1", "--ntasks-per-node", "1", *faults, "--", sys.executable, str(ROOT / args[0]),
                  *args[1:], "--checkpoint-dir", str(d / "ckpt"), "--weights-out", str(d / "w.pt"))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
        runs[name] = (out, _weights(d / "w.pt"))
    summary = runs["preempted"][0].stdout.split("slurmrt sim summary")[1]
    assert "preemption (requeued)" in summary and "signal" in summary, summary
    a, b = runs["reference"][1], runs["preempted"][1]
    diff = {k: float((a[k].float() - b[k].float()).abs().max()) for k in a}  # type: ignore[union-attr]
    print(framework, diff)
    assert all(torch.equal(a[k], b[k]) for k in a), diff  # type: ignore[arg-type]
