"""A training program written the way users write them (gloo, gradients averaged with ``all_reduce`` as in PyTorch's
distributed tutorial, ``torch.save`` checkpoints), whose training function is wrapped in ``client.restartable`` so
that a peer's death restarts it in the same process.

Why not DDP here: with three or more ranks DDP is not bitwise resumable. A resumed DDP model's first step reduces its
gradients in the initial bucket layout, an uninterrupted run's in the rebuilt one, and gloo's ring sums each element
in an order that depends on its place in the bucket (floating-point addition of three values is not associative).
Per-parameter all-reduces keep every element's place, so a resumed run is bitwise an uninterrupted one.

``train()`` is what any start does: build the process group from the ``env://`` variables, build the model, load
``$SUPERVISOR_RESUME_FROM`` (or the newest ``checkpoint-<step>.pt`` in ``--ckpt-dir``), train. Each batch depends
only on the seed, the step and the rank, so a resumed run trains on exactly the batches an uninterrupted one does.
``--raise-at-step N`` (with ``--raise-rank``): once per campaign (a marker file in ``--ckpt-dir``), that rank's
training raises a ValueError at step N, as a bug in the program would; ``--hang-at-step N``: once per campaign,
that rank sleeps forever after step N (a live hang: its process runs, its peers block in the next all_reduce);
``--fail-generation G``: that rank exits 3 at its start in generation G (a second fault during a warm restart);
``--ignore-order-rank R``: rank R waits like the others but never sees a restart order. Every start prints
``start rank=R pid=P generation=G step=S`` on stderr; rank 0 prints ``step=N loss=X`` per step
and, at the end, saves the final weights to ``--out``. Rank 0 saves every ``--ckpt-every`` steps (a temporary file
renamed into place) and all ranks meet at a barrier after it.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from supervisor import client


def latest(ckpt_dir: Path) -> Path | None:
    found = [(int(m.group(1)), Path(n)) for n in glob.glob(str(ckpt_dir / "checkpoint-*.pt"))
             if (m := re.search(r"checkpoint-(\d+)\.pt$", n))]  # fmt: skip
    return max(found)[1] if found else None


def once(marker: Path) -> bool:
    try:
        marker.touch(exist_ok=False)
        return True
    except FileExistsError:
        return False


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    if args.fail_generation and client.generation() == args.fail_generation and \
            int(os.environ.get("RANK", "-1")) == args.raise_rank:  # fmt: skip
        print(f"ValueError: rank {args.raise_rank} cannot start in generation {args.fail_generation}", file=sys.stderr,
              flush=True)  # fmt: skip
        raise SystemExit(3)  # a second fault while a warm restart is under way
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt_dir = Path(args.ckpt_dir)
    path = Path(client.resume_from() or "") if client.resume_from() else latest(ckpt_dir)
    start = 0
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
    print(f"start rank={rank} pid={os.getpid()} generation={client.generation()} step={start}", file=sys.stderr,
          flush=True)  # fmt: skip
    for step in range(start + 1, args.steps + 1):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = ((model(x) - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():  # the tutorial's average_gradients
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world
        opt.step()
        client.step(step, loss=float(loss.item()))
        if step == args.raise_at_step and rank == args.raise_rank and once(ckpt_dir / ".raised"):
            raise ValueError(f"a bad sample at step {step}")
        if step == args.hang_at_step and rank == args.raise_rank and once(ckpt_dir / ".hung"):
            while True:  # a live hang: the process runs (sleeps), its peers block in the next all_reduce
                time.sleep(1)
        if rank == 0:
            print(f"step={step} loss={float(loss.item())!r}", flush=True)
        if step % args.ckpt_every == 0:
            if rank == 0:
                tmp = ckpt_dir / f".checkpoint-{step}.pt.tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt_dir / f"checkpoint-{step}.pt")
            dist.barrier()
        time.sleep(args.step_time)
    dist.barrier()
    if rank == 0:
        torch.save(model.state_dict(), args.out)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pg-timeout", type=float, default=120.0)
    p.add_argument("--out", required=True)
    p.add_argument("--raise-at-step", type=int, default=0)
    p.add_argument("--raise-rank", type=int, default=1, help="the rank that raises or hangs")
    p.add_argument("--hang-at-step", type=int, default=0)
    p.add_argument("--fail-generation", type=int, default=0, help="that rank exits 3 at its start in this generation")
    p.add_argument("--ignore-order-rank", type=int, default=-1, help="this rank never sees a restart order")
    args = p.parse_args()
    Path(args.ckpt_dir).mkdir(parents=True, exist_ok=True)
    if args.ignore_order_rank >= 0 and int(os.environ.get("RANK", "-1")) == args.ignore_order_rank:
        # a client that cannot read its orders (a test's stand-in)
        from supervisor.client import restart as _restart

        _restart.read_order = lambda *a, **k: None  # type: ignore[assignment]
    client.restartable(train)(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads can abort the interpreter's exit under load (pytorch#179291)


if __name__ == "__main__":
    main()
