"""A training program written the way FSDP2 (or DDP) users write them, plain ``torch.distributed.checkpoint`` to
``--ckpt-dir/step_<N>`` every ``--ckpt-every`` steps, plus the memory tier through the DCP storage writer and reader
as docs/checkpoints.md shows (``DcpMemory``: ``dcp.save(state, storage_writer=memory.writer(step))`` when
``memory.due(step)``; at start ``dcp.load(state, storage_reader=memory.reader(step))`` when the supervisor picked a
snapshot every rank has). No other supervisor API: no client, no CheckpointSaver.

The batch of each step comes from a generator seeded with the step and rank (a restart needs no data-loader
state), so an interrupted and resumed run prints bitwise the losses of an uninterrupted one. Rank 0 prints
``resumed from memory at step N`` or ``resumed from PATH at step N``, and ``step=N loss=X`` per step.
``--die-at-step N``: every rank SIGKILLs itself right after step N (its snapshot, when due, written first).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from supervisor.checkpoint.dcp_memory import DcpMemory


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--ddp", action="store_true", help="DDP (replicated weights) instead of FSDP2")
    p.add_argument("--die-at-step", type=int, default=0)
    return p.parse_args()


def newest(ckpt_dir: Path) -> tuple[Path, int] | None:
    found = [(int(m.group(1)), p) for p in ckpt_dir.glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and (p / ".metadata").exists()]  # fmt: skip
    return (max(found)[1], max(found)[0]) if found else None


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if args.ddp:
        model = DistributedDataParallel(model)
    else:
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    memory = DcpMemory()

    def state() -> dict:
        model_sd, opt_sd = get_state_dict(model, opt)
        return {"model": model_sd, "optim": opt_sd}

    start = 0
    picked = memory.resume_step()
    if picked is not None:
        current = state()
        dcp.load(current, storage_reader=memory.reader(picked))
        set_state_dict(model, opt, model_state_dict=current["model"], optim_state_dict=current["optim"])
        start = picked
        if rank == 0:
            print(f"resumed from memory at step {start}", file=sys.stderr, flush=True)
    elif (found := newest(ckpt_dir)) is not None:
        current = state()
        dcp.load(current, checkpoint_id=str(found[0]))
        set_state_dict(model, opt, model_state_dict=current["model"], optim_state_dict=current["optim"])
        start = found[1]
        if rank == 0:
            print(f"resumed from {found[0]} at step {start}", file=sys.stderr, flush=True)
    for step in range(start + 1, args.steps + 1):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = ((model(x) - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step={step} loss={float(loss.item())!r}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
        if step % args.ckpt_every == 0 or step == args.steps:
            dcp.save(state(), checkpoint_id=str(ckpt_dir / f"step_{step}"))
        if memory.due(step):
            dcp.save(state(), storage_writer=memory.writer(step))
        if step == args.die_at_step:
            memory.close()  # the snapshot's write finished, as it would have a moment later
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)
    memory.close()
    dist.barrier()
    dist.destroy_process_group()
    # Out now, before main()'s locals go: DDP's reducer freed after its process group hung rank 0 forever in 1 run
    # of 30 under load (py-spy: the main thread idle at `code = main()`, rank 1 gone; the test's 240 s timeout).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter finalization: gloo's threads can abort it under load (pytorch#179291)
