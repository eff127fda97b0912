"""Own time with real FSDP2 (``fully_shard`` on a CPU mesh, 3 local processes, gloo, no Slurm):
``client.watch_collectives`` counts the all-gathers and reduce-scatters FSDP2 issues as waiting, so the slot's own
times name the rank the others wait for while every rank's step time is the same; and the training is the same
with and without it (the wrappers only time the calls)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

WORKER = r"""
import json, os, sys, time
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from supervisor import client
from supervisor.client import slot as S

rank, world, port, slot_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
mesh = init_device_mesh("cpu", (world,))

def train(watched):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 1))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    if watched:
        assert client.watch_collectives()
    client.step(0)
    for step in range(1, 13):
        x = torch.randn(8, 64, generator=gen)
        out = net(x)
        if watched and rank == 2:
            time.sleep(0.5)  # rank 2 computes slower: the others wait for it in FSDP2's collectives
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if watched:
            client.step(step)
    if watched:
        client.unwatch_collectives()
    return [p.full_tensor().detach().clone() for p in net.parameters()]

plain = train(False)
watched = train(True)
same = all(torch.equal(a, b) for a, b in zip(plain, watched))
rec = S.read_slot(S.slot_path(slot_dir, rank))
print(json.dumps({"rank": rank, "same": same, "iter": rec.iter_ewma_ns, "own": rec.own_ewma_ns}), flush=True)
dist.barrier()
dist.destroy_process_group()
# Leave without the interpreter's finalization: a gloo thread still dropping a collective's tensors then aborts
# the process after the work is done (pytorch/pytorch#179291; examples/train_ddp.py's leave()).
sys.stdout.flush()
os._exit(0)
"""


def test_watched_fsdp2_own_time_names_the_slow_rank_and_training_is_unchanged(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "SUPERVISOR_"))}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), "3", str(port), str(slots)],
                              env=dict(env, SUPERVISOR_SLOT_DIR=str(slots), RANK=str(r), WORLD_SIZE="3"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]  # fmt: skip
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    got = {d["rank"]: d for d in (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)}
    assert all(d["same"] for d in got.values()), got  # the wrappers change nothing in the training
    periods = [got[r]["iter"] for r in range(3)]
    assert max(periods) < 1.3 * min(periods), got  # synchronous: every rank steps at the slow one's pace
    assert got[2]["own"] > 2 * max(got[0]["own"], got[1]["own"]), got  # its own time stands out
