"""``supervise doctor``: say whether this machine can run supervised jobs, and what to fix if not."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HELP = "check that this machine can run supervised jobs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def _checks() -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    for tool in ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel"):
        path = shutil.which(tool)
        checks.append((f"{tool} on PATH", path is not None, path or "install the Slurm client (slurm-client)"))
    checks.append(("SLURM_CONF", True, os.environ.get("SLURM_CONF", "(default /etc/slurm/slurm.conf)")))
    checks.append(("python", sys.version_info >= (3, 10), sys.version.split()[0]))
    return checks


def run(args: argparse.Namespace) -> int:
    checks = _checks()
    ok = all(passed for _, passed, _ in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [{"name": n, "ok": p, "detail": d} for n, p, d in checks]}))
    else:
        for name, passed, detail in checks:
            print(f"{'ok  ' if passed else 'FAIL'}  {name}: {detail}")
    return 0 if ok else 4
