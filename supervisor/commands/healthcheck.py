"""``supervise healthcheck [--json] [--expect-gpus N]``: is this node fit to train? Exit 8 when it is not.

Run it on a node (e.g. ``srun -N4 --ntasks-per-node=1 supervise healthcheck``, or from a Slurm
HealthCheckProgram); GPU checks need an NVIDIA driver and are reported as skipped without one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

HELP = "check this node's health (GPUs via NVML, /dev/shm); exit 8 when unfit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print readings and problems as JSON")
    parser.add_argument("--expect-gpus", type=int, default=None,
                        help="GPUs this node must show (default: $SLURM_GPUS_ON_NODE when set)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from supervisor.errors import HealthCheckFailed
    from supervisor.health.checks import evaluate, fit
    from supervisor.health.probe import read_node

    expected = args.expect_gpus
    if expected is None and os.environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        expected = int(os.environ["SLURM_GPUS_ON_NODE"])
    reading = read_node(expected)
    problems = evaluate(reading)
    if args.json:
        print(json.dumps({"reading": dataclasses.asdict(reading), "fit": fit(problems),
                          "problems": [dataclasses.asdict(p) for p in problems]}, indent=2))  # fmt: skip
    else:
        gpus = f"{len(reading.gpus)} GPUs" if reading.nvml == "ok" else f"GPU checks skipped: {reading.nvml}"
        print(f"node {reading.node}: /dev/shm {'writable' if reading.shm_writable else 'NOT writable'}, "
              f"{reading.shm_free_bytes >> 20} MiB free; {gpus}")
        for p in problems:
            print(f"{p.severity.upper():5} {p.what} (fix: {p.fix})")
    if not fit(problems):
        if args.json:
            return HealthCheckFailed.exit_code
        raise HealthCheckFailed(f"node {reading.node} is unfit: {problems[0].what}", problems[0].fix)
    return 0
