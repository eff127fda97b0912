"""``supervise run [--campaign DIR] [--config FILE] [--checkpoint-dir DIR] [-- CMD...]``: the batch step.

Inside an allocation (the batch script `supervise submit` writes calls it), it supervises the training command
of the campaign. Run by hand inside ``salloc``/``sbatch`` with ``-- CMD...`` it creates the campaign first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from supervisor.errors import CampaignError, UsageError
from supervisor.paths import CampaignPaths

HELP = "supervise the training step inside an allocation (the batch step)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "supervise run [--campaign DIR] [--config FILE] [--checkpoint-dir DIR] [-- CMD...]"
    parser.add_argument("--campaign", metavar="DIR", help="campaign directory (created if CMD is given)")
    parser.add_argument("--config", metavar="FILE", help="TOML config (only when creating the campaign)")
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="where the training writes checkpoints")


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="supervise run", allow_abbrev=False)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code == 0:
            raise
        raise UsageError(f"bad arguments for supervise run: {' '.join(argv)}", "see `supervise run --help`") from None
    args.command = command
    return args


def _campaign(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from supervisor import campaign, config

    if args.campaign and not args.command:
        return campaign.load(args.campaign)
    if not args.command:
        raise UsageError("nothing to supervise", "pass --campaign DIR (made by supervise submit) or -- CMD...")
    root = Path(args.campaign) if args.campaign else Path("campaigns") / f"job{os.environ.get('SLURM_JOB_ID', 'local')}"
    if CampaignPaths(root).spec.exists():
        paths, spec = campaign.load(root)
        if list(spec.command) != list(args.command):
            raise CampaignError(f"{root} holds a campaign for another command", "pick a new --campaign directory")
        return paths, spec
    from supervisor.checkpoint.locate import RESUME_OFF_HINT

    cfg = config.with_checkpoint_dir(config.load(args.config), args.checkpoint_dir, args.command, os.getcwd())
    if not cfg.run.checkpoint_dir:
        print(f"supervise: {RESUME_OFF_HINT}", file=sys.stderr)
    spec = campaign.CampaignSpec(command=tuple(args.command), config=cfg.to_dict(), cwd=os.getcwd(),
                                 python=sys.executable, created=time.time())
    return campaign.create(root, spec, batch_script=""), spec


def run(args: argparse.Namespace) -> int:
    from slurm.client import get_client
    from slurm.env import SlurmEnv
    from supervisor import config
    from supervisor.driver.compose import Attempt
    from supervisor.heartbeat.secret import create_secret
    from supervisor.logsetup import configure

    env = SlurmEnv.from_environ()
    if not env.job_id or not env.nodelist:
        raise UsageError("supervise run must run inside a Slurm allocation (no SLURM_JOB_ID / node list)",
                         "use `supervise submit`, or call it from an sbatch script or salloc")
    paths, spec = _campaign(args)
    cfg = config.from_mapping(spec.config, str(paths.spec))
    if args.checkpoint_dir:  # given again for a campaign that exists: this run looks there (resolved the same way)
        cfg = config.with_checkpoint_dir(cfg, args.checkpoint_dir, (), os.getcwd())
    if not paths.secret.exists():
        create_secret(paths.root)
    configure(paths.logs / "supervisor.jsonl")
    return Attempt(paths, spec, cfg, env, get_client()).run()
