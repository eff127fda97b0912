"""Own time with real DDP (3 local processes, gloo, no Slurm): ``client.watch_ddp`` leaves the gradients bitwise
as DDP's built-in all-reduce makes them, and the slot's own times name the rank the others wait for while every
rank's step time is the same."""

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
from supervisor import client
from supervisor.client import slot as S

rank, world, port, slot_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

def model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return torch.nn.parallel.DistributedDataParallel(net)

builtin, watched = model(), model()
assert client.watch_ddp(watched)
gen = torch.Generator().manual_seed(rank)
same = True
client.step(0)
for step in range(1, 13):
    x = torch.randn(8, 32, generator=gen) * 3
    for m in (builtin, watched):
        m.zero_grad()
        out = m(x)
        if m is watched and rank == 2:
            time.sleep(0.15)  # rank 2 computes slower: the others wait for it in the all-reduce
        out.pow(2).mean().backward()
    same &= all(torch.equal(a.grad, b.grad) for a, b in zip(builtin.parameters(), watched.parameters()))
    client.step(step)
rec = S.read_slot(S.slot_path(slot_dir, rank))
print(json.dumps({"rank": rank, "same": same, "iter": rec.iter_ewma_ns, "own": rec.own_ewma_ns}), flush=True)
dist.barrier()
dist.destroy_process_group()
# Leave without the interpreter's finalization: a gloo thread still dropping a collective's tensors then aborts
# the process after the work is done (pytorch/pytorch#179291; examples/train_ddp.py's leave()).
sys.stdout.flush()
os._exit(0)
"""


def test_watched_ddp_keeps_gradients_bitwise_and_own_time_names_the_slow_rank(tmp_path: Path) -> None:
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
    assert all(d["same"] for d in got.values()), got  # bitwise the gradients of DDP's built-in all-reduce
    periods = [got[r]["iter"] for r in range(3)]
    assert max(periods) < 1.3 * min(periods), got  # synchronous: every rank steps at the slow one's pace
    assert got[2]["own"] > 2 * max(got[0]["own"], got[1]["own"]), got  # its own time stands out
