"""Full verification throughput vs ``cat FILES > /dev/null`` on the same files, same run. Goal: >= 90 %.

Both are measured cold (each file's page cache dropped with posix_fadvise(DONTNEED) first: the case of
a restart verifying what another node wrote) and warm (files already in the page cache). Also prints
the raw in-memory speed of each supported hash, which is how the default (crc32) was chosen.

    .venv/bin/python bench/bench_checkpoint_verify.py [--shards 8] [--shard-mib 128] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from supervisor.checkpoint.durable import write_durable  # noqa: E402
from supervisor.checkpoint.hashing import (  # noqa: E402
    _FACTORIES,  # noqa: E402
    DEFAULT_ALGORITHM,
    available,
    hash_file,
)
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest  # noqa: E402
from supervisor.checkpoint.validate import validate_checkpoint  # noqa: E402

GOAL = 0.90


def make(root: Path, shards: int, shard_mib: int, algorithm: str) -> tuple[Path, list[Path]]:
    d = root / "step_000000001"
    d.mkdir(parents=True)
    block = os.urandom(1 << 20)
    files, entries = [], []
    for i in range(shards):
        p = d / f"__{i}_0.distcp"
        with open(p, "wb") as f:
            for _ in range(shard_mib):
                f.write(block)
        size, digest = hash_file(p, algorithm)
        files.append(p)
        entries.append(FileEntry(p.name, size, digest))
    write_durable(d / MANIFEST_NAME, Manifest(1, time.time(), shards, algorithm, tuple(entries)).to_json())
    os.sync()
    return d, files


def drop_cache(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn, files: list[Path], cold: bool) -> float:
    if cold:
        drop_cache(files)
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def hash_speeds(mib: int = 256) -> dict[str, float]:
    data = memoryview(os.urandom(mib << 20))
    out = {}
    for name in ("crc32c", "crc32", "sha256", "blake2b"):
        if not available(name):
            continue
        h = _FACTORIES[name]()
        t = time.perf_counter()
        for i in range(0, len(data), 1 << 20):
            h.update(data[i:i + (1 << 20)])  # type: ignore[attr-defined]
        out[name] = len(data) / (time.perf_counter() - t) / 1e9
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=128)
    ap.add_argument("--algorithm", default=DEFAULT_ALGORITHM)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("in-memory hash speed, GB/s per core: "
          + ", ".join(f"{k} {v:.2f}" for k, v in hash_speeds().items()))
    root = Path(tempfile.mkdtemp(prefix="bench-verify-", dir=args.dir))
    try:
        ckpt, files = make(root, args.shards, args.shard_mib, args.algorithm)
        total = sum(p.stat().st_size for p in files)

        def cat() -> None:
            subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)

        def verify() -> None:
            v = validate_checkpoint(ckpt, full=True)
            assert v.status == "valid", v.reason

        for mode, cold in (("cold", True), ("warm", False)):
            if not cold:
                cat()  # warm the page cache
            t_cat = statistics.median(timed(cat, files, cold) for _ in range(args.repeat))
            t_ver = statistics.median(timed(verify, files, cold) for _ in range(args.repeat))
            ratio = t_cat / t_ver
            print(f"{mode}: {total / 2**20:.0f} MiB in {args.shards} shards  cat {total / t_cat / 1e9:.2f} GB/s  "
                  f"verify({args.algorithm}) {total / t_ver / 1e9:.2f} GB/s  = {ratio:.0%} of cat "
                  f"(goal >= {GOAL:.0%}: {'PASS' if ratio >= GOAL else 'FAIL'})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
