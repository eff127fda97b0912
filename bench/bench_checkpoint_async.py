"""Training-loop blocking time of an async save vs a sync save of the same few-hundred-MB state.

Sync blocks for write + fsync + hash + commit; async only while the state is copied to CPU memory
(staging), then writes and commits in a background thread. Prints both medians and the ratio.

    .venv/bin/python bench/bench_checkpoint_async.py [--model-mib 256] [--repeat 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from supervisor.checkpoint.commit import CheckpointSaver  # noqa: E402
from supervisor.checkpoint.store import CheckpointStore  # noqa: E402

warnings.filterwarnings("ignore")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    torch.set_num_threads(1)
    tensors = max(1, args.model_mib // 16)  # 16 MiB tensors, like a model's layers
    state = {"model": {f"layer{i}.weight": torch.randn(4 << 20) for i in range(tensors)}}
    root = Path(tempfile.mkdtemp(prefix="bench-async-", dir=args.dir))
    try:
        saver = CheckpointSaver(root, keep_last=1)
        step = 0
        blocked: dict[str, list[float]] = {"sync": [], "async": []}
        total: dict[str, list[float]] = {"sync": [], "async": []}
        for _ in range(args.repeat):
            for mode in ("sync", "async"):
                step += 1
                t = time.perf_counter()
                saver.save(state, step, async_save=mode == "async")
                blocked[mode].append(time.perf_counter() - t)
                saver.wait()
                total[mode].append(time.perf_counter() - t)
        saver.close()
        best = CheckpointStore(root).newest_valid(full=True)
        assert best is not None and best.step == step
        sync_b, async_b = statistics.median(blocked["sync"]), statistics.median(blocked["async"])
        print(f"state {tensors * 16} MiB: sync save blocks {sync_b:.3f} s (total {statistics.median(total['sync']):.3f} s); "
              f"async blocks {async_b:.3f} s (total {statistics.median(total['async']):.3f} s)")
        print(f"async/sync blocking ratio = {async_b / sync_b:.3f} ({sync_b / async_b:.1f}x less blocking)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
