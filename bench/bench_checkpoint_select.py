"""Newest-valid selection over a synthetic 16,384-shard checkpoint (quick level). Goal: <= 2 s.

Baseline, measured in the same run: the bare minimum any size check needs - one os.stat per shard file.
Scenario "fallback": the newest checkpoint misses a shard, so it is quarantined and the previous
16,384-shard checkpoint is validated and chosen.

    .venv/bin/python bench/bench_checkpoint_select.py [--shards 16384] [--dir /tmp]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from supervisor.checkpoint.durable import write_durable  # noqa: E402
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest  # noqa: E402
from supervisor.checkpoint.store import CheckpointStore, checkpoint_name  # noqa: E402

GOAL_S = 2.0


def make(root: Path, step: int, shards: int) -> Path:
    d = root / checkpoint_name(step)
    d.mkdir(parents=True)
    payload = b"x" * 64
    entries = []
    for i in range(shards):
        name = f"__{i}_0.distcp"
        (d / name).write_bytes(payload)
        entries.append(FileEntry(name, len(payload), "00000000"))  # quick level never reads hashes
    write_durable(d / MANIFEST_NAME, Manifest(step, time.time(), shards, "crc32", tuple(entries)).to_json())
    return d


def stat_walk(d: Path) -> float:
    t = time.perf_counter()
    for name in os.listdir(d):
        os.stat(d / name)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=16384)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-select-", dir=args.dir))
    try:
        make(root, 100, args.shards)
        newest = make(root, 200, args.shards)
        store = CheckpointStore(root)
        base = statistics.median(stat_walk(newest) for _ in range(args.repeat))
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            info = store.newest_valid(full=False)
            times.append(time.perf_counter() - t)
            assert info is not None and info.step == 200
        ours = statistics.median(times)
        fallback = []
        for _ in range(args.repeat):
            (newest / "__7_0.distcp").unlink()
            t = time.perf_counter()
            info = store.newest_valid(full=False, quarantine=True)
            fallback.append(time.perf_counter() - t)
            assert info is not None and info.step == 100
            shutil.rmtree(root / "quarantine")
            newest = make(root, 200, args.shards)
        fb = statistics.median(fallback)
        print(f"shards={args.shards}  baseline stat-walk {base:.3f} s")
        print(f"newest_valid (newest ok)        {ours:.3f} s  = {ours / base:.2f}x baseline, goal <= {GOAL_S} s: "
              f"{'PASS' if ours <= GOAL_S else 'FAIL'}")
        print(f"newest_valid (fallback+quarantine) {fb:.3f} s = {fb / base:.2f}x baseline, goal <= {GOAL_S} s: "
              f"{'PASS' if fb <= GOAL_S else 'FAIL'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
