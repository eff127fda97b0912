"""Two gloo ranks as a user writes them (model, optimizer created after ``init_process_group``): rank 1 raises at
step 3, lets go of its group as ``client.restartable`` does (``_release_process_group``) and stays alive; rank 0,
in its next all_reduce, must fail within a moment, not when rank 1's process ends. ``--dynamo-first``: the
client's ``_import_dynamo_first`` runs before the group is built, as ``client.restartable`` does under a
supervisor. Rank 1 prints ``released SOCKETS`` (its TCP sockets left), rank 0 ``failed after S``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from supervisor.client import restart


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dynamo-first", action="store_true")
    args = p.parse_args()
    if args.dynamo_first:
        restart._import_dynamo_first()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=2,
                            timeout=timedelta(seconds=60))  # fmt: skip
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    started = time.monotonic()
    try:
        for step in range(1, 1000):
            loss = ((model(torch.randn(32, 16)) - 1) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                started = time.monotonic()
                dist.all_reduce(param.grad)
            opt.step()
            if step == 3 and args.rank == 1:
                raise ValueError("a bad sample")
            time.sleep(0.05)
    except Exception:
        if args.rank == 0:
            print(f"failed after {time.monotonic() - started:.2f}", flush=True)
            os._exit(0)
    del model, opt
    restart._release_process_group()
    print(f"released {sockets()}", flush=True)
    time.sleep(8)  # alive, as a rank waiting for its restart order
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
