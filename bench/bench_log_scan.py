#!/usr/bin/env python3
"""First error wins at scale: a synthetic 4,096-rank launch log (>= 200 MB), its root-cause line first and then
every other rank's NCCL watchdog trace (one round per process group), judged two ways in the same run:

  ours      the launch log's digest (decisions/log_digest.py via driver/launch_log.py): read as it grows in
            16 MiB passes, the earliest error lines of every task and of the whole log, plus the last 64 KiB
  baseline  the last 64 KiB / 400 lines of the log (what the supervisor read before)

For each case (a device-side assert: app_error, nobody blamed; an Xid 79 printed on one node: hardware, that node
blamed) it prints the verdict of each, the digest's scan throughput (MB/s on one core, the digest alone, the file
already in the page cache) as the supervisor runs it for this launch (``python3 train.py`` under srun: no torchrun,
so torchrun's report lines are not looked for) and, for comparison, as for a launch that may run torchrun
(``bash train.sh``: they are), and the digest's peak Python memory (tracemalloc, in a separate pass: tracing
slows the scan). Goals (issue 26): the right verdict, >= 500 MB/s, <= 64 MiB.

Usage: python bench/bench_log_scan.py [--ranks 4096] [--mb 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.decisions import tasklog  # noqa: E402
from supervisor.decisions.classify import Evidence, classify  # noqa: E402
from supervisor.decisions.log_digest import LogDigest  # noqa: E402
from supervisor.driver.distenv import plain_python  # noqa: E402
from supervisor.driver.launch_log import PASS_BYTES, TAIL_BYTES, TAIL_LINES, LaunchLog  # noqa: E402

COMMAND = ("python3", "train.py")  # the launch that wrote this log (one rank per srun task)
MARKERS = not plain_python(COMMAND)  # what the launcher passes LaunchLog for it

TRACE = [
    "[rank{r}]:[E1204 18:10:19.840416429 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=4121, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for "
    "600043 milliseconds before timing out.",
    "[rank{r}]:[E1204 18:10:19.840416430 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {r}] failure "
    "detected by watchdog at work sequence id: 4121 PG status: last enqueued work: 4121, last completed work: 4120",
    "[rank{r}]:[E1204 18:10:19.840416431 ProcessGroupNCCL.cpp:667] Stack trace of the failed collective not found, "
    "potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a "
    "non-zero value.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
    "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4121, OpType=ALLREDUCE, NumelIn=262144, "
    "NumelOut=262144, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.",
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:635 (most "
    "recent call first):",
    *[f"frame #{i}: c10::Error::Error(c10::SourceLocation, std::string) + 0x{i:x}96 (0x7f3c2b1a{i:04x} in "
      "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libc10.so)" for i in range(40)],
]  # fmt: skip
CASES = {
    "device-side assert": ("[rank{r}]: torch.AcceleratorError: CUDA error: device-side assert triggered", "app_error",
                           False),
    "Xid 79 on one node": ("[rank{r}]: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.",
                           "hardware", True),
}  # fmt: skip
FIRST_RANK = 1234


def write_log(path: Path, ranks: int, mb: int, first: str) -> int:
    with open(path, "w") as out:
        for r in range(200):
            out.write(f"{r % 64}: step=100 loss=0.5\n")
        out.write(f"{FIRST_RANK}: " + first.format(r=FIRST_RANK) + "\n")
        while out.tell() < mb * 1_000_000:
            for r in range(ranks):
                if r != FIRST_RANK:  # the failed rank exited: every other rank's watchdog fires
                    out.write("".join(f"{r}: " + line.format(r=r) + "\n" for line in TRACE))
        return out.tell()


def verdict(lines: list[str], ranks: int) -> tuple[str, tuple[str, ...]]:
    nodes = tuple(f"gpu{i:04d}" for i in range(ranks))
    got = classify(Evidence(log_lines=tasklog.attribute(lines, nodes), task_nodes=nodes, allocation_nodes=nodes,
                            job_state="RUNNING", node_states={n: "MIXED" for n in nodes}))  # fmt: skip
    return got.cls, got.blamed_nodes


def tail_lines(path: Path) -> list[str]:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return [line for line in f.read().decode(errors="replace").split("\n") if line][-TAIL_LINES:]


def scan(path: Path, ranks: int, markers: bool = MARKERS) -> tuple[float, int]:
    """(seconds, passes) to digest the whole file in the supervisor's 16 MiB passes."""
    digest = LogDigest(tasks=ranks, markers=markers)
    passes = 0
    start = time.perf_counter()
    with open(path, "rb") as f:
        while chunk := f.read(PASS_BYTES):
            digest.feed(chunk)
            passes += 1
    digest.finish()
    return time.perf_counter() - start, passes


def peak_memory(path: Path, ranks: int) -> int:
    """Peak Python memory of reading and digesting the log in 16 MiB passes: the pass's chunk (freed after each
    pass) and everything the digest keeps."""
    tracemalloc.start()
    digest = LogDigest(tasks=ranks, markers=MARKERS)
    with open(path, "rb") as f:
        while chunk := f.read(PASS_BYTES):
            digest.feed(chunk)
            del chunk
    digest.finish()
    digest.lines()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--mb", type=int, default=200, help="log size in MB (10^6 bytes)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        log = Path(tmp) / "train-1.log"
        for name, (first, expected, blames) in CASES.items():
            size = write_log(log, args.ranks, args.mb, first)
            log.read_bytes()  # into the page cache: the figure is the scan's, not the disk's
            ours = verdict(LaunchLog(log, tasks=args.ranks, markers=MARKERS).lines(), args.ranks)
            base = verdict(tail_lines(log), args.ranks)
            seconds = min(scan(log, args.ranks)[0] for _ in range(3))
            with_markers = min(scan(log, args.ranks, markers=True)[0] for _ in range(3))
            peak = peak_memory(log, args.ranks)
            want_blamed = (f"gpu{FIRST_RANK:04d}",) if blames else ()
            row = {"case": name, "log_mb": round(size / 1e6, 1), "ranks": args.ranks, "expected": expected,
                   "ours": ours[0], "ours_blamed": list(ours[1]), "ours_right": ours == (expected, want_blamed),
                   "baseline": base[0], "baseline_blamed": list(base[1][:3]),
                   "baseline_right": base == (expected, want_blamed), "scan_mb_s": round(size / seconds / 1e6),
                   "scan_mb_s_torchrun_possible": round(size / with_markers / 1e6),
                   "peak_mib": round(peak / 2**20, 1)}  # fmt: skip
            results.append(row)
            print(f"{name:22s} {row['log_mb']:6.1f} MB  expected {expected:9s}  ours {ours[0]:9s} "
                  f"{'right' if row['ours_right'] else 'WRONG'}  tail {base[0]:10s} "
                  f"{'right' if row['baseline_right'] else 'wrong'}  scan {row['scan_mb_s']} MB/s "
                  f"({row['scan_mb_s_torchrun_possible']} MB/s if torchrun could be in it)  "
                  f"peak {row['peak_mib']} MiB")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["ours_right"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
