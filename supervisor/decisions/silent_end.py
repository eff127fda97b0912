"""A Slurm run that ended without its supervisor's word: what the next run journals for it, and whether that run
may go on. Pure.

Why: a run's supervisor can die with its batch host, be killed by an admin or the OOM killer, or be ended by Slurm
with the whole job; the journal then has a launch and no ending. The next run infers the ending from what is
certain, in this order: the agents' ``failsafe`` event (they requeued the job without the lost batch host), the
batch script's line (its supervisor died of a signal), Slurm's node states (DOWN nodes of that run, agents gone
silent), the accounting record of that run (``sacct``: its state, exit code and nodes), the job's PreemptTime.
What none of them says stays ``unknown`` and blames nobody.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from slurm.model import JobInfo, JobRun
from supervisor.decisions import events as ev
from supervisor.decisions.campaign_state import FINAL_STATES, CampaignState, _text, _texts
from supervisor.decisions.policy import PolicyConfig, over_budget

# Accounting's state of an earlier run -> (class, confidence, what it means). NODE_FAIL and BOOT_FAIL blame only
# the run's nodes Slurm reports DOWN now (accounting does not say which node failed).
ACCOUNTED: dict[str, tuple[str, float, str]] = {
    "NODE_FAIL": (ev.NODE_FAILURE, 0.8, "Slurm ended it for a failed node"),
    "BOOT_FAIL": (ev.NODE_FAILURE, 0.7, "a node failed to boot for it"),
    "PREEMPTED": (ev.PREEMPTION, 0.9, "it was preempted"),
    "TIMEOUT": (ev.TIMEOUT, 0.9, "it reached its time limit"),
    "DEADLINE": (ev.TIMEOUT, 0.9, "it reached its deadline"),
    "OUT_OF_MEMORY": (ev.APP_ERROR, 0.6, "it ran out of memory (its memory limit)"),
}


def accounted_run(runs: Sequence[JobRun], job_id: str, started: float | None = None) -> JobRun | None:
    """The accounting record of the run that ended silently: the newest ended run of ``job_id`` (an earlier run of
    the job: ``sacct --duplicates`` lists one per requeue) that started no earlier than the silent attempt
    (``started``, when known) minus a minute of clock skew."""
    ended = [r for r in runs if r.job_id == job_id and r.end_time is not None and r.state not in ("RUNNING", "PENDING")]
    if started is not None:
        ended = [r for r in ended if r.start_time is None or r.start_time >= started - 60]
    return max(ended, key=lambda r: (r.start_time or 0, r.end_time or 0), default=None)


def accounting_line(run: JobRun) -> str:
    exit_code = f", exit {run.exit_code}:{run.exit_signal or 0}" if run.exit_code is not None else ""
    nodes = f" on {','.join(run.nodes)}" if run.nodes else ""
    reason = f" ({run.reason})" if run.reason else ""
    return f"sacct: the previous run of job {run.job_id} ended {run.state}{reason}{exit_code}{nodes}"


def infer_previous_outcome(state: CampaignState, down_nodes: Iterable[str], job: JobInfo | None = None,
                           died: str | None = None, runs: Sequence[JobRun] | None = None) -> list[ev.Event]:
    """When a Slurm run ended without its supervisor recording how (Slurm requeued or killed the whole job, e.g. a
    node failure took the batch host down), infer the outcome now so the report and the ledger stay true.

    ``down_nodes``: nodes Slurm reports DOWN/NOT_RESPONDING now. ``runs``: the job's accounting records
    (``sacct``; None: unknown, no accounting). ``died``: the batch script's line saying the
    previous run's supervisor died of a signal and the script requeued the job (``batchwrap.death_note``): the
    supervisor's own death is nobody's node's fault (``unknown``, nobody blamed). Returns the events to journal (an interruption
    and the attempt's end), stamped with the last time the previous run was heard of."""
    last_attempt = state.open_attempt
    if last_attempt is None:
        return []
    nodes = _texts(last_attempt.get("nodes"))
    started = last_attempt.get("t")
    run = accounted_run(runs, str(last_attempt.get("job_id") or ""), float(started) if isinstance(
        started, (int, float)) else None) if runs else None  # fmt: skip
    down_set = set(down_nodes)
    down = sorted(n for n in nodes if n in down_set)
    silent = state.silent_nodes
    failsafe = state.failsafe
    if failsafe is not None and _text(failsafe.get("batch_host")):
        blamed, cls, confidence = [str(failsafe["batch_host"])], ev.NODE_FAILURE, 0.9
        evidence = [f"failsafe: the agent on {failsafe.get('node')} found the supervisor gone and "
                    f"{failsafe.get('action')}d the job: {failsafe.get('reason', '')}"]
    elif died:
        blamed, cls, confidence = [], ev.UNKNOWN, 0.5
        evidence = [f"the batch script: {died.removeprefix('supervise: ')}", "the supervisor's own death "
                    "blames no node; the campaign continues from its journal"]  # fmt: skip
    elif down or silent:
        blamed = down or sorted(silent)
        cls, confidence = ev.NODE_FAILURE, 0.9 if down else 0.6
        evidence = [f"node {n} is DOWN/NOT_RESPONDING in Slurm after the previous run ended" for n in down]
        evidence += [f"node agent on {n} went silent before the previous run ended" for n in sorted(silent)]
        evidence += [accounting_line(run)] if run is not None else []
    elif run is not None and run.state in ACCOUNTED:
        cls, confidence, meaning = ACCOUNTED[run.state]
        blamed, evidence = [], [f"{accounting_line(run)}: {meaning}"]
    elif job is not None and job.preempt_time:
        blamed, cls, confidence = [], ev.PREEMPTION, 0.8
        evidence = [f"Slurm recorded a preemption time {job.preempt_time} for the job"]
    else:
        blamed, cls, confidence = [], ev.UNKNOWN, 0.1
        evidence = ["the previous run ended without a word from its supervisor (killed with the job?)"]
        evidence += [accounting_line(run)] if run is not None else []
    t = state.last_seen
    return [
        ev.interruption_event(t, cls, blamed, confidence, evidence),
        ev.attempt_ended(t, str(last_attempt.get("job_id") or ""), cls, blamed, evidence),
    ]



def after_supervisor_death(state: CampaignState, died: str | None, config: PolicyConfig,
                           now: float) -> tuple[str, str] | None:  # fmt: skip
    """The run the batch script requeued after its supervisor died (``died``: the script's line): whether it must
    end at once instead of supervising, as (campaign state, one-line reason); None to go on.

    - The campaign had already ended (completed, failed, stopped) when its supervisor was killed on its way out:
      nothing is run or journaled again; the run ends as the campaign did.
    - The supervisor keeps dying: its deaths (``unknown``) over the class's budget without progress, or too many
      faults in the restart window, as for any fault (``policy``): the campaign fails instead of a requeue loop.
    """
    if not died:
        return None
    if state.ended is not None and state.ended.get("state") in FINAL_STATES:
        end = str(state.ended["state"])
        return end, f"the campaign had already ended ({end}) when its supervisor died: nothing to run"
    reason = over_budget(ev.UNKNOWN, state.history, config, now)
    if reason is not None:
        return "failed", f"the supervisor itself keeps dying ({reason}): the campaign stops; see the batch log"
    return None
