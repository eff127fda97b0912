"""``supervise doctor``: can this machine run supervised jobs, and is Slurm configured the way the supervisor
relies on? Each setting is printed with its value, why it matters and what to change.

Exit codes: 0 nothing wrong (warnings are printed; ``--strict`` makes them count), 3 a Slurm setting the
supervisor cannot work with (or a warning under ``--strict``), 4 Slurm commands missing or slurmctld unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

HELP = "check this machine and Slurm's running configuration for what the supervisor relies on"
EXIT_SETTINGS = 3  # the documented "configuration error" code: here Slurm's configuration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--strict", action="store_true", help="warnings count as problems (exit 3)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="a campaign config (TOML): judge GraceTime against its run.checkpoint_grace_s")  # fmt: skip


def _tools() -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    for tool in ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel"):
        path = shutil.which(tool)
        checks.append({"setting": f"{tool} on PATH", "value": path or "missing", "status": "ok" if path else "fail",
                       "why": "the supervisor drives Slurm through its commands",
                       "fix": "" if path else "install the Slurm client (slurm-client)"})  # fmt: skip
    checks.append({"setting": "python", "value": sys.version.split()[0], "status": "ok" if sys.version_info >= (3, 10)
                   else "fail", "why": "the supervisor needs Python 3.10+", "fix": ""})  # fmt: skip
    checks.append({"setting": "SLURM_CONF", "value": os.environ.get("SLURM_CONF", "(default /etc/slurm/slurm.conf)"),
                   "status": "ok", "why": "which cluster the commands talk to", "fix": ""})  # fmt: skip
    return checks


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from slurm.client import get_client
    from slurm.errors import SlurmUnavailable
    from slurm.retry import RetryPolicy
    from supervisor.config import load
    from supervisor.health.slurm_config import judge

    config = load(args.config)
    checks = _tools()
    unavailable = None
    if all(c["status"] == "ok" for c in checks):
        # Interactive: a short retry budget, so an unreachable slurmctld is reported in seconds, not a minute.
        client: Any = get_client("cli", policy=RetryPolicy(budget_s=10.0, call_timeout_s=10.0))
        try:
            settings, partitions = client.config(), client.partitions()
        except SlurmUnavailable as err:
            unavailable = err.one_line()
        else:
            findings = judge(settings, partitions, checkpoint_grace_s=config.run.checkpoint_grace_s,
                             signal_lead_s=config.submit.signal_lead_s)  # fmt: skip
            checks += [dataclasses.asdict(f) for f in findings]
    else:
        unavailable = "Slurm commands missing: the configuration was not read"
    statuses = {c["status"] for c in checks}
    status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
    if args.json:
        print(json.dumps({"ok": status == "ok" and unavailable is None, "status": status,
                          "unavailable": unavailable, "checks": checks}, indent=1))  # fmt: skip
    else:
        for c in checks:
            line = f"{c['status'].upper():4}  {c['setting']} = {c['value']}: {c['why']}"
            print(line + (f"\n      fix: {c['fix']}" if c["fix"] and c["status"] != "ok" else ""))
        if unavailable:
            print(f"FAIL  {unavailable}")
    if unavailable is not None:
        return 4
    if status == "fail" or (status == "warn" and args.strict):
        return EXIT_SETTINGS
    return 0
