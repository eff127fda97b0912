"""The start of an attempt (one Slurm run of the job), before anything is launched: what the journal says, and
what it must say before this run goes on.

* ``campaign_started`` is journaled by the first run only.
* A previous run that ended without a word (its batch host died with the job, or the supervisor itself was
  killed) gets its outcome inferred now (``silent_end.infer_previous_outcome``: the agents' ``failsafe``
  event, the batch script's line in the batch log, Slurm's node states, or the run's accounting record), so the
  report and the ledger stay true.
* A run the batch script requeued after its supervisor died ends at once when the campaign had already ended, or
  when the supervisor keeps dying (``silent_end.after_supervisor_death``).
* ``attempt_started``.

Returns the exit code of a run that must end here, else None.
"""

from __future__ import annotations

import sys
from typing import Any

from slurm.client import SlurmClient
from slurm.env import SlurmEnv
from slurm.errors import AccountingUnavailable, SlurmError
from slurm.model import JobRun
from supervisor.batchwrap import read_death_note
from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev
from supervisor.decisions.policy import PolicyConfig
from supervisor.driver.context import Context
from supervisor.driver.evidence import guarded_job, guarded_nodes
from supervisor.driver.guard import SLURM_QUERY
from supervisor.paths import CampaignPaths


def open_attempt(ctx: Context, state: campaign_state.CampaignState, *, paths: CampaignPaths, env: SlurmEnv,
                 command: Any, nodes: tuple[str, ...], slurm: SlurmClient, policy: PolicyConfig) -> int | None:  # fmt: skip
    """``state``: the campaign state the attempt keeps (each event journaled here is applied to it)."""
    job_id = env.job_id or ""
    now = ctx.clock()
    ended_before = state.ended
    if not state.started:
        ctx.record(ev.campaign_started(now, str(paths.root), command, job_id))
    known_nodes = guarded_nodes(ctx, slurm, nodes) or {}
    job, _ = guarded_job(ctx, slurm, job_id)
    down = [n for n, info in known_nodes.items() if info.is_down]
    died = death_note(state, paths, job_id)
    runs = accounting(ctx, slurm, job_id) if state.open_attempt is not None else None
    for event in silent_end.infer_previous_outcome(state, down, job, died, runs):
        ctx.record(event)
    stop = silent_end.after_supervisor_death(state, died, policy, now)
    if stop is not None:
        end, reason = stop
        if ended_before is None:
            ctx.record(ev.campaign_ended(ctx.clock(), end, reason))
        print(f"supervise: {reason}", file=sys.stderr, flush=True)
        return 0 if end == "completed" else 1
    ctx.record(ev.attempt_started(now, job_id, env.restart_count, nodes, None))
    return None


def death_note(state: campaign_state.CampaignState, paths: CampaignPaths, job_id: str) -> str | None:
    """The batch script's line, when the previous run's supervisor died of a signal and it requeued the job."""
    last = state.last_attempt
    restart = last.get("restart") if last is not None else None
    if last is None or str(last.get("job_id")) != job_id or not isinstance(restart, int):
        return None
    return read_death_note(paths.batch_log(job_id), job_id, restart)


def accounting(ctx: Context, slurm: SlurmClient, job_id: str) -> list[JobRun] | None:
    """The job's runs from accounting (``sacct``), asked only when the journal lacks a run's ending; None when
    the site has no accounting or it did not answer (unknown: the inference goes on without it)."""
    try:
        return slurm.history(job_id)
    except AccountingUnavailable:
        return None
    except SlurmError as err:
        ctx.record(ev.supervisor_error(ctx.clock(), SLURM_QUERY, f"sacct: {err}"))
        return None
