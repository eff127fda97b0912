"""``supervise cancel CAMPAIGN [--checkpoint] [--job JOBID] [--timeout S]``: stop a campaign for good.

A running supervisor is told through the campaign directory (``supervisor.stop_request``): with ``--checkpoint``
it first asks every rank to save and waits for the save to commit; then it stops the training, journals the
campaign as stopped ("cancelled by the user") and ends its job, which is never requeued. A job that is not
running (pending, or its supervisor does not answer within ``--timeout``) is cancelled with scancel; when no
supervisor is left to journal it, this command journals the stop itself.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.decisions.campaign_state import CampaignState

HELP = "stop a campaign for good (optionally checkpointing first); never requeued"
POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", metavar="CAMPAIGN", help="campaign directory")
    parser.add_argument("--checkpoint", action="store_true",
                        help="ask every rank to checkpoint first and wait for the save to commit")  # fmt: skip
    parser.add_argument("--job", metavar="JOBID", default=None,
                        help="the campaign's Slurm job (default: the one its journal names; needed before it started)")
    parser.add_argument("--timeout", metavar="S", type=float, default=None,
                        help="seconds to wait for the supervisor (default: 60, plus run.checkpoint_grace_s with "
                             "--checkpoint); then the job is cancelled with scancel")  # fmt: skip


def _state(path: Path) -> CampaignState:
    """The journal's one fold (an empty campaign before the first run wrote anything)."""
    from supervisor import journal
    from supervisor.decisions import campaign_state

    return campaign_state.fold(journal.read(path) if path.exists() else [])


def run(args: argparse.Namespace) -> int:
    from slurm.client import get_client
    from slurm.errors import SlurmError
    from supervisor import campaign, config, journal, stop_request
    from supervisor.decisions import events as ev
    from supervisor.decisions.campaign_state import FINAL_STATES
    from supervisor.errors import UsageError

    paths, spec = campaign.load(args.campaign)
    cfg = config.from_mapping(spec.config, str(paths.spec))
    if args.timeout is not None and not (0 < args.timeout <= 86400):
        raise UsageError(f"--timeout {args.timeout:g} is out of range", "give seconds in (0, 86400]")
    state = _state(paths.journal)
    ended = state.ended  # campaign_ended after the newest attempt (a resubmitted campaign starts again)
    if ended is not None and ended.get("state") not in FINAL_STATES:
        ended = None  # held: the job waits in the queue for a release; cancelling it ends the campaign
    if ended is not None:
        print(f"supervise: campaign {paths.root} already ended ({ended['state']}: {ended.get('reason', '')})")
        return 0
    job_id = args.job or state.job_id
    if job_id is None:
        raise UsageError(f"no Slurm job is known for campaign {paths.root} yet (it has not started)",
                         "pass the job id `supervise submit` printed: --job JOBID")  # fmt: skip
    timeout = args.timeout if args.timeout is not None else 60.0 + (
        cfg.run.checkpoint_grace_s if args.checkpoint else 0.0)
    slurm = get_client()
    job = slurm.job(job_id)  # SlurmError: one line, exit 4/5 through the CLI
    stop_request.write(paths.root, args.checkpoint, time.time())
    try:
        if job is not None and job.is_running:
            ended = _wait_for_end(paths.journal, timeout)
        if ended is None:  # pending, gone, or the supervisor did not answer: Slurm ends it, never requeued
            try:
                if job is not None and not job.is_finished:
                    slurm.cancel(job_id)
            except SlurmError:
                if job is not None and job.is_pending:
                    raise
            ended = _wait_for_end(paths.journal, 10.0) if job is not None and job.is_running else None
            if ended is None:
                with journal.Journal(paths.journal) as writer:
                    writer.append(ev.campaign_ended(time.time(), "stopped", stop_request.REASON))
                ended = {"state": "stopped", "reason": stop_request.REASON}
    finally:
        stop_request.clear(paths.root)
    saved = _saved_line(_state(paths.journal), args.checkpoint)
    print(f"supervise: campaign {paths.root} {ended['state']}: {ended.get('reason', '')} (job {job_id}){saved}")
    return 0 if ended["state"] == "stopped" else 1


def _wait_for_end(path: Path, timeout: float) -> Mapping[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = _state(path).ended
        if ended is not None:
            return ended
        time.sleep(POLL_S)
    return None


def _saved_line(state: CampaignState, asked: bool) -> str:
    if not asked:
        return ""
    if state.checkpoint_request_t is None:
        return "; no checkpoint was requested (the training was not running)"
    if state.saved_since_request is not None:
        return f"; checkpoint saved at step {state.saved_since_request}"
    return "; the requested checkpoint did not commit (see `supervise report`)"
