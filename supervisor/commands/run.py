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
    try:
        return Attempt(paths, spec, cfg, env, get_client()).run()
    except Exception as err:  # noqa: BLE001 - past every stage's guard: a bug; it was journaled (supervisor_error)
        crash(err)
        raise  # (not reached: crash() does not return)


def crash(err: BaseException) -> None:
    """End as a crashed supervisor: one line on stderr, the traceback in the log, then SIGABRT (no core file).
    The batch script (supervisor/batchwrap.py) requeues the job after a crash signal, and the next run continues
    the campaign from the journal; a supervisor that keeps crashing stops the campaign (its budget for unknown
    faults, ``silent_end.after_supervisor_death``), never a requeue loop."""
    import resource
    import signal
    import traceback

    import structlog

    structlog.get_logger("supervisor").error("supervisor_crashed", error=f"{type(err).__name__}: {err}"[:500],
                                             traceback="".join(traceback.format_exception(err))[-8000:])  # fmt: skip
    print(f"supervise: error: the supervisor failed ({type(err).__name__}: {str(err)[:200]}); it ends as crashed so "
          "the batch script requeues the job and its next run continues the campaign (see logs/supervisor.jsonl)",
          file=sys.stderr, flush=True)  # fmt: skip
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGABRT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGABRT)
