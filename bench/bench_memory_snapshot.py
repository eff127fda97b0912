"""The memory tier's cost to the training (issue 27), side by side in one run:

1. Blocking time of one memory snapshot of a >= 256 MiB state (``MemorySnapshots.save``: the copy into reused
   CPU buffers; the file, its SHA-256 and its record are written in the background) against the memcpy floor for
   the same bytes (``copy_`` into preallocated buffers). Goal: <= 1.5x.
2. Training step time with snapshots (the "auto" cadence) and the copy to a buddy agent on loopback, against the
   same loop with the memory tier off, in alternating blocks. Goal: <= 3 % slower. The step is a 1-thread matmul
   loop, so the background write, hash and copy have the other core: on this 2-core machine they compete with
   the training for memory bandwidth, unlike a GPU node where the step runs on the GPU.

    .venv/bin/python bench/bench_memory_snapshot.py [--state-mib 256] [--repeat 5] [--steps 40] [--step-ms 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from supervisor.agent.replication import Receiver, Sender  # noqa: E402
from supervisor.checkpoint.memory import MemorySnapshots  # noqa: E402
from supervisor.heartbeat.orders import Peer  # noqa: E402

KEY = os.urandom(32)


def state_of(mib: int) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": torch.randn(4 << 20) for i in range(max(1, mib // 16))}  # 16 MiB tensors


def blocking(state: dict[str, torch.Tensor], root: Path, repeat: int) -> tuple[float, float, float]:
    """(median memcpy floor s, median snapshot blocking s, median snapshot total s)."""
    bufs = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():  # touch the floor's buffers once, as the snapshot's are after its first save
        bufs[k].copy_(v)
    mem = MemorySnapshots(root, keep=2, every=1)
    mem.save(state, 0)
    mem.wait()
    floor, blocked, total = [], [], []
    for step in range(1, repeat + 1):
        t = time.perf_counter()
        for k, v in state.items():
            bufs[k].copy_(v)
        floor.append(time.perf_counter() - t)
        t = time.perf_counter()
        mem.save(state, step)
        blocked.append(time.perf_counter() - t)
        mem.wait()
        total.append(time.perf_counter() - t)
    mem.close()
    return statistics.median(floor), statistics.median(blocked), statistics.median(total)


def train(steps: int, step_ms: float, state: dict[str, torch.Tensor], mem: MemorySnapshots | None) -> float:
    """Median step time of a loop whose step is ``step_ms`` of 1-thread matmuls, snapshotting when ``mem``."""
    a = torch.randn(256, 256)
    calib = time.perf_counter()
    for _ in range(20):
        a @ a
    per = (time.perf_counter() - calib) / 20
    reps = max(1, round(step_ms / 1000 / per))
    times = []
    for step in range(1, steps + 1):
        t = time.perf_counter()
        for _ in range(reps):
            a @ a
        if mem is not None:
            mem.snapshot(state, step)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=200.0)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    args = ap.parse_args()
    torch.set_num_threads(1)
    state = state_of(args.state_mib)
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    work = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=args.dir))
    try:
        floor, blocked, total = blocking(state, work / "cost", args.repeat)
        print(f"state {nbytes / 2**20:.0f} MiB: memcpy floor {floor:.3f} s ({nbytes / floor / 1e9:.2f} GB/s); snapshot "
              f"blocks {blocked:.3f} s, written in the background in {total:.3f} s")
        print(f"snapshot blocking / memcpy = {blocked / floor:.2f}x (goal <= 1.5x)")

        node1, node2 = work / "node1", work / "node2"
        node2.mkdir()
        receiver = Receiver(node2, KEY, job="bench", node="node2", host="127.0.0.1")
        receiver.start()
        sender = Sender(node1, KEY, job="bench", node="node1")
        sender.start()
        host, port = receiver.address.rsplit(":", 1)
        sender.set_buddy(Peer("node2", host, int(port)))
        off, on = [], []
        mem = MemorySnapshots(node1, keep=2)  # "auto": measured by its first snapshots
        try:
            for _ in range(2):  # alternating blocks: drift in the machine's load hits both
                off.append(train(args.steps, args.step_ms, state, None))
                on.append(train(args.steps, args.step_ms, state, mem))
        finally:
            mem.close()
            sender.close()
            receiver.close()
        slow = statistics.median(on) / statistics.median(off) - 1
        print(f"step {statistics.median(off) * 1000:.1f} ms off, {statistics.median(on) * 1000:.1f} ms with snapshots "
              f"every {mem.every} step(s) copied to a buddy ({sender.counters['sent']} shards sent): "
              f"{slow * 100:+.1f} % (goal <= 3 %)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
