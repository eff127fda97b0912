"""Preflight measurements, one task per node under srun (needs torch; the supervisor never imports this).

Rendezvous through a file on the shared campaign filesystem (torch's FileStore: no address to resolve), then:
1. compute: a fixed matmul workload on every rank at once, in ``--rounds`` rounds between barriers, the fastest of
   ``--round-reps`` repetitions per round (a throttled node is slow in every round; a moment of contention spoils
   one round, and every node of that round shares it);
2. point-to-point: rank 0 ping-pongs a small message (latency) and a large one (bandwidth) with each peer, the
   peers taken in turn inside each round, so a burst of load lands on every peer's figures of that round alike;
   the fastest exchange of each round is kept (noise only ever adds time);
3. all-reduce: bus bandwidth of the whole group (one number for the record; a collective cannot say who is slow).
The per-round figures let the judgement (``preflight.judge``) ask "slower than its peers in 3/4 of the rounds?", not
"slower once?".
Each rank writes ``rank-N.json`` into ``--out``; rank 0 adds the p2p figures per peer. The backend is gloo on CPU,
NCCL when every rank sees a GPU (``--backend auto``). Everything is bounded by ``--budget-s``.

    srun --nodes=N --ntasks-per-node=1 python -m supervisor.health.preflight_worker --out DIR --budget-s 30
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def _write(out: Path, name: str, doc: dict[str, Any]) -> None:
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="preflight_worker")
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--small-bytes", type=int, default=8)
    parser.add_argument("--large-bytes", type=int, default=4 << 20)
    parser.add_argument("--reps", type=int, default=7, help="all-reduce repetitions (x2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-reps", type=int, default=3, help="repetitions per round (the fastest is kept)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    out = Path(args.out)
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    result: dict[str, Any] = {"rank": rank, "node": node, "world": world, "ok": False}
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        # For diagnosis, and the tests that throttle one node (once torch is loaded: the measurement is slowed,
        # not the import).
        _write(out, f"pid-{rank}", {"pid": os.getpid(), "node": node})
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        device = torch.device("cuda", int(os.environ.get("SLURM_LOCALID", "0"))) if backend == "nccl" else \
            torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        left = max(5.0, args.budget_s - (time.monotonic() - started))
        dist.init_process_group(backend, init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=left))  # fmt: skip
        result["backend"] = backend
        dist.barrier()

        rounds = [_compute(torch, device, args.round_reps, dist) for _ in range(max(1, args.rounds))]
        result["compute_rounds_s"] = rounds
        result["compute_s"], result["compute_median_s"] = min(rounds), statistics.median(rounds)
        dist.barrier()
        result.update(_p2p(torch, dist, device, rank, world, args))
        dist.barrier()
        result["allreduce_busbw_Bps"] = _allreduce(torch, dist, device, world, args)
        result["ok"] = True
        dist.barrier()
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported to the supervisor, which decides
        result["error"] = f"{type(err).__name__}: {err}"[:500]
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    _write(out, f"rank-{rank}.json", result)
    return 0 if result["ok"] else 1


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compute(torch: Any, device: Any, reps: int, dist: Any) -> float:
    """One round, every rank at once (a barrier first): the fastest repetition, what the node can do now."""
    a = torch.rand(192, 192, device=device)
    dist.barrier()
    times = []
    for _ in range(max(1, reps)):
        _sync(torch, device)
        t0 = time.perf_counter()
        b = a
        for _ in range(100):
            b = torch.mm(b, a)
            b = b / b.norm()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return min(times)


def _p2p(torch: Any, dist: Any, device: Any, rank: int, world: int, args: Any) -> dict[str, Any]:
    """Rank 0 ping-pongs each peer, the peers in turn inside each round; per peer and round the fastest one-way
    time of a small message and of a large one. Returns rank 0's per-peer figures (others return nothing)."""
    small = torch.zeros(max(1, args.small_bytes // 4), device=device)
    large = torch.zeros(max(1, args.large_bytes // 4), device=device)
    samples: dict[int, dict[str, list[float]]] = {p: {"latency": [], "large": []} for p in range(1, world)}
    for _ in range(max(1, args.rounds)):
        for peer in range(1, world):
            for name, tensor in (("latency", small), ("large", large)):
                best = float("inf")
                for _ in range(max(1, args.round_reps)):
                    if rank == 0:
                        _sync(torch, device)
                        t0 = time.perf_counter()
                        dist.send(tensor, peer)
                        dist.recv(tensor, peer)
                        _sync(torch, device)
                        best = min(best, (time.perf_counter() - t0) / 2)  # one way
                    elif rank == peer:
                        dist.recv(tensor, 0)
                        dist.send(tensor, 0)
                if rank == 0:
                    samples[peer][name].append(best)
    if rank != 0:
        return {}
    nbytes = large.numel() * 4
    peers = {}
    for peer, got in samples.items():
        bandwidth = [nbytes / t for t in got["large"]]
        peers[str(peer)] = {"latency_s": statistics.median(got["latency"]), "latency_rounds_s": got["latency"],
                            "bandwidth_Bps": statistics.median(bandwidth), "bandwidth_rounds_Bps": bandwidth}  # fmt: skip
    return {"p2p": peers}


def _allreduce(torch: Any, dist: Any, device: Any, world: int, args: Any) -> float:
    tensor = torch.ones(max(1, args.large_bytes // 4), device=device)
    times = []
    for _ in range(max(3, args.reps // 2)):
        _sync(torch, device)
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    algbw = tensor.numel() * 4 / statistics.median(times)
    return algbw * 2 * (world - 1) / world if world > 1 else algbw


if __name__ == "__main__":
    sys.exit(main())
