"""A sharded model on gloo/CPU (FSDP2's ``fully_shard``, or tensor parallel), trained, checkpointed through
slurmrt (DCP), and resumed on any number of ranks: what an FSDP2 or TP user's script does.

``--steps N`` trains steps 0..N-1 from the newest checkpoint (or from scratch), saving at every ``--save-every``.
Each rank writes ``<out>/rank<R>.json``; rank 0 also writes ``<out>/state.pt``: the full (unsharded) parameters and
optimizer state, as they were when the last checkpoint was saved (the ``--at-save`` snapshot) and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import slurmrt


def build(mode: str, world: int, hidden: int = 16) -> tuple[Any, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    mesh = init_device_mesh("cpu", (world,))
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def full(sd: dict[str, Any]) -> dict[str, Any]:
    """The unsharded copy of a (model or optimizer) state dict: what equality is checked on."""
    import torch
    from torch.distributed.tensor import DTensor

    def walk(o: Any) -> Any:
        if isinstance(o, DTensor):
            return o.full_tensor().clone()
        if isinstance(o, torch.Tensor):
            return o.clone()
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    return walk(sd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=["fsdp", "tp"], required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--background", action="store_true", help="non-blocking saves")
    p.add_argument("--hidden", type=int, default=16, help="the hidden width (a multiple of the world size)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    rt = slurmrt.init()
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    dist.init_process_group("gloo")
    model, optim = build(args.mode, rt.world_size, args.hidden)
    msd, osd = get_state_dict(model, optim)  # the template, sharded as this run shards the model
    got = rt.load_latest(into={"model": msd, "optim": osd})
    start = 0
    if got is not None:
        step, state = got
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = step + 1
        if rt.local_state is not None:  # this rank's own RNG, as it was at the save
            torch.set_rng_state(rt.local_state["rng"])
    resumed = full(dict(zip(("model", "optim"), get_state_dict(model, optim), strict=True)))
    at_save: dict[str, Any] | None = None
    for step in range(start, args.steps):
        if rt.should_stop(step):
            break
        g = torch.Generator().manual_seed(step)  # the same batch on every rank, whatever the world size
        x = torch.randn(4, 8, generator=g)
        model(x).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
        if args.save_every and (step + 1) % args.save_every == 0:
            msd, osd = get_state_dict(model, optim)
            rt.save({"model": msd, "optim": osd}, step=step, blocking=not args.background,
                    local={"rng": torch.get_rng_state(), "rank": rt.rank})
            at_save = full({"model": msd, "optim": osd}) | {"step": step}
    final = full(dict(zip(("model", "optim"), get_state_dict(model, optim), strict=True)))
    code = rt.finish()
    if rt.rank == 0:
        torch.save({"at_save": at_save, "final": final, "resumed": resumed}, out / "state.pt")
    info = {"rank": rt.rank, "world_size": rt.world_size, "start": start, "exit_code": int(code),
            "local_state": None if rt.local_state is None else {"rank": rt.local_state["rank"]}}
    (out / f"rank{rt.rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    sys.exit(int(code))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
