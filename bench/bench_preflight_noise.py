#!/usr/bin/env python3
"""No verdict from noise: how often the preflight leaves a healthy node out on a loaded machine, ours against the
rule it replaces, run alternately in the same session (issue 26).

Every run measures the local cluster's nodes (none of them slow: any node left out is a false out) with both cores
kept busy by ``--load`` spinning processes, and judges the measurement as a 3-node job with 1 spare would:

  ours      the rounds worker (health/preflight_worker.py) and decisions/slow_nodes.py: slower in most rounds,
            beyond the factor and a floor, and worth more than the spare it takes (the cost model)
  baseline  the worker and judgement of git revision ``--baseline-rev`` (one ratio on one measurement: the rule
            that once left a node out for "latency 1353 us vs 366 us on its peers (> 2x)")

Goal: 0 false outs in 50 preflights on the loaded 2-core machine. Needs the local cluster up (``make cluster-up``).

Usage: python bench/bench_preflight_noise.py [--runs 50] [--load 2] [--baseline-rev b45876f] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from supervisor.health import preflight  # noqa: E402

NODES = ["node1", "node2", "node3", "node4"]


def _spin() -> None:
    while True:
        pass


def _baseline(rev: str, into: Path) -> tuple[Path, Any]:
    """The worker script and the judge of revision ``rev`` (read from git, nothing checked out)."""
    worker = into / "baseline_worker.py"
    worker.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:supervisor/health/preflight_worker.py"],
                                     check=True, capture_output=True, text=True).stdout)  # fmt: skip
    module = into / "baseline_preflight.py"
    module.write_text(subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:supervisor/health/preflight.py"],
                                     check=True, capture_output=True, text=True).stdout)  # fmt: skip
    spec = importlib.util.spec_from_file_location("baseline_preflight", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules["baseline_preflight"] = loaded  # (dataclasses look their module up)
    spec.loader.exec_module(loaded)
    return worker, loaded


def _measure(command: list[str], out: Path, budget_s: float) -> tuple[list[dict[str, Any]], float]:
    out.mkdir(parents=True)
    minutes = max(1, int((budget_s + 59) // 60))
    from slurm import srun

    argv = srun.preflight(NODES, [*command, "--out", str(out), "--budget-s", f"{budget_s:g}"], minutes=minutes,
                          extra=["--mem=0"])  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=budget_s + 60, check=False)
    return preflight.read_results(out), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="preflights of each rule")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="spinning processes (both cores)")
    parser.add_argument("--baseline-rev", default="b45876f")
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--json", help="write every run's verdicts and figures here")
    args = parser.parse_args()

    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(dir=REPO / ".cluster" if (REPO / ".cluster").is_dir() else None) as tmp:
            work = Path(tmp)
            old_worker, old = _baseline(args.baseline_rev, work)
            ours_cmd = [sys.executable, "-m", "supervisor.health.preflight_worker"]
            base_cmd = [sys.executable, str(old_worker)]
            for i in range(args.runs):
                for rule, command in (("ours", ours_cmd), ("baseline", base_cmd)):
                    results, took = _measure(command, work / f"{rule}-{i}", args.budget_s)
                    if rule == "ours":
                        verdict = preflight.judge(results, NODES, spares=1)
                    else:
                        verdict = old.judge(results, NODES)
                    rows.append({"run": i, "rule": rule, "unknown": verdict.unknown, "out": dict(verdict.slow),
                                 "kept": dict(getattr(verdict, "kept", {})), "seconds": round(took, 1),
                                 "errors": dict(verdict.errors), "results": results})  # fmt: skip
                    mark = "?" if verdict.unknown else ("OUT " + ", ".join(sorted(verdict.slow)) if verdict.slow
                                                        else "ok")  # fmt: skip
                    print(f"run {i + 1:>3} {rule:<8} {took:5.1f} s  {mark}"
                          + (f"  ({'; '.join(f'{n}: {w}' for n, w in verdict.slow.items())})" if verdict.slow else ""),
                          flush=True)  # fmt: skip
    finally:
        for p in spinners:
            p.kill()
    print()
    print(f"{'rule':<9} {'runs':>5} {'inconclusive':>12} {'false outs':>10}  (load: {args.load} spinning processes on "
          f"{os.cpu_count()} cores)")  # fmt: skip
    for rule in ("ours", "baseline"):
        mine = [r for r in rows if r["rule"] == rule]
        print(f"{rule:<9} {len(mine):>5} {sum(r['unknown'] for r in mine):>12} "
              f"{sum(bool(r['out']) for r in mine):>10}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
