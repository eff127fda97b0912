"""Preflight measurements, one task per node under srun (needs torch; the supervisor never imports this).

Rendezvous through a file on the shared campaign filesystem (torch's FileStore: no address to resolve), then:
1. compute: a fixed matmul workload, the fastest of several repetitions (a throttled or overloaded node is
   slow in all of them; a moment of contention spoils only some);
2. point-to-point: rank 0 ping-pongs a small message (latency) and a large one (bandwidth) with each peer in turn;
3. all-reduce: bus bandwidth of the whole group (one number for the record; a collective cannot say who is slow).
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
    parser.add_argument("--reps", type=int, default=7)
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

        result["compute_s"], result["compute_median_s"] = _compute(torch, device, args.reps)
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


def _compute(torch: Any, device: Any, reps: int) -> tuple[float, float]:
    """(fastest, median) repetition: the fastest is what the node can do, robust to a moment of contention."""
    a = torch.rand(192, 192, device=device)
    times = []
    for _ in range(reps):
        _sync(torch, device)
        t0 = time.perf_counter()
        b = a
        for _ in range(150):
            b = torch.mm(b, a)
            b = b / b.norm()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def _p2p(torch: Any, dist: Any, device: Any, rank: int, world: int, args: Any) -> dict[str, Any]:
    """Rank 0 ping-pongs each peer in turn; returns rank 0's per-peer figures (others return nothing)."""
    small = torch.zeros(max(1, args.small_bytes // 4), device=device)
    large = torch.zeros(max(1, args.large_bytes // 4), device=device)
    peers: dict[str, Any] = {}
    for peer in range(1, world):
        figures = {}
        for name, tensor in (("latency_s", small), ("large_rtt_s", large)):
            rtts = []
            for _ in range(args.reps):
                if rank == 0:
                    _sync(torch, device)
                    t0 = time.perf_counter()
                    dist.send(tensor, peer)
                    dist.recv(tensor, peer)
                    _sync(torch, device)
                    rtts.append((time.perf_counter() - t0) / 2)  # one way
                elif rank == peer:
                    dist.recv(tensor, 0)
                    dist.send(tensor, 0)
            if rank == 0:
                figures[name] = statistics.median(rtts)
        if rank == 0:
            figures["bandwidth_Bps"] = large.numel() * 4 / figures["large_rtt_s"]
            peers[str(peer)] = figures
    return {"p2p": peers} if rank == 0 else {}


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
