"""A training program written the way FSDP2 users write them: ``fully_shard`` per layer, plain
``torch.distributed.checkpoint`` (``dcp.save``/``dcp.load`` of ``get_state_dict``) into ``--ckpt-dir/step_<N>``, the
process group from the environment (``init_process_group("gloo")``: RANK, WORLD_SIZE, MASTER_ADDR/PORT, as the
supervisor or torchrun set them).

The supervisor's client is used as docs/client.md shows: ``client.watch_collectives()`` once after
``init_process_group`` (own time per step for stragglers), ``client.step(i, loss=...)``, a save when
``client.should_checkpoint()`` or ``client.should_stop()`` (every rank agrees on it through an all-reduce), inside
``client.phase("checkpoint")``. It resumes from ``$SUPERVISOR_RESUME_FROM`` when set, else the newest ``step_<N>``
in ``--ckpt-dir``; rank 0 prints ``resumed from PATH at step N`` and ``step=N loss=X`` per step.

``--slow-rank R --slow-s S --slow-from-step N``: rank R's forward pass takes S seconds longer from step N on (a slow
GPU); when ``--ckpt-dir/slow-node`` exists at step N, the rank on the node it names is the slow one instead (a slow
node, not a slow rank: a relaunch without that node runs at full speed).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from supervisor import client


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.3)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    return p.parse_args()


def newest(ckpt_dir: Path) -> tuple[Path, int] | None:
    found = [(int(m.group(1)), p) for p in ckpt_dir.glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and (p / ".metadata").exists()]  # fmt: skip
    return (max(found)[1], max(found)[0]) if found else None


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    client.watch_collectives()
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    slow: bool | None = None  # decided at --slow-from-step
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    resume = client.resume_from()
    picked = (Path(resume), int(re.search(r"(\d+)$", resume).group(1))) if resume else newest(ckpt_dir)  # type: ignore[union-attr]
    if picked is not None:
        with client.phase("restore"):
            model_sd, opt_sd = get_state_dict(model, opt)
            state = {"model": model_sd, "optim": opt_sd}
            dcp.load(state, checkpoint_id=str(picked[0]))
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = picked[1]
        if rank == 0:
            print(f"resumed from {picked[0]} at step {start}", file=sys.stderr, flush=True)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16, generator=gen)
        out = model(x)
        if slow is None and step >= args.slow_from_step:
            named = ckpt_dir / "slow-node"
            slow = os.environ.get("SLURMD_NODENAME") == named.read_text().strip() if named.exists() else \
                rank == args.slow_rank  # fmt: skip
        if slow:
            time.sleep(args.slow_s)
        loss = ((out - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(args.step_time)
        client.step(step, loss=float(loss.item()))
        if rank == 0:
            print(f"step={step} loss={float(loss.item())!r}", flush=True)
        flags = torch.tensor([int(client.should_checkpoint()), int(client.should_stop())])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if step % args.ckpt_every == 0 or flags.any():
            with client.phase("checkpoint"):
                model_sd, opt_sd = get_state_dict(model, opt)
                dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=str(ckpt_dir / f"step_{step}"))
        if flags[1]:
            break
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
