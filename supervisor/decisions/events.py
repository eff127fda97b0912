"""The campaign journal's event vocabulary.

Every decision the supervisor makes is one of these events, so that ``status``, ``report``, the node ledger
and goodput accounting can all be recomputed from the journal alone. Constructors return plain dicts (what
the journal stores); they take the time as an argument because this module, like the rest of the decision
core, never reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# (contract) Interruption classes, and the outcome of a run that finished normally.
PREEMPTION = "preemption"
TIMEOUT = "timeout"
NODE_FAILURE = "node_failure"
HARDWARE = "hardware"
HANG = "hang"
COMM_ERROR = "comm_error"
APP_ERROR = "app_error"
NUMERICAL = "numerical"
CANCELLED = "cancelled"
UNKNOWN = "unknown"
STRAGGLER = "straggler"  # not a fault: a slow node swapped out for a spare (decisions/straggler_swap.py)
COMPLETED = "completed"

INTERRUPTION_CLASSES: tuple[str, ...] = (
    PREEMPTION,
    TIMEOUT,
    NODE_FAILURE,
    HARDWARE,
    HANG,
    COMM_ERROR,
    APP_ERROR,
    NUMERICAL,
    CANCELLED,
    UNKNOWN,
)
# The contract's classes (../shared/design/architecture.md) are the causes the classifier finds. A launch may also
# end by the supervisor's own choice: a straggler swapped out for a spare (not a fault; budget and tier like a class).
RESTART_CLASSES: tuple[str, ...] = (*INTERRUPTION_CLASSES, STRAGGLER)
OUTCOMES: tuple[str, ...] = (*RESTART_CLASSES, COMPLETED)

# (contract) campaign states, as reported by ``report --json``.
CAMPAIGN_STATES: tuple[str, ...] = ("running", "pending", "completed", "failed", "held", "stopped")

# Event type names: the ``type`` field of a journal line.
CAMPAIGN_STARTED = "campaign_started"
ATTEMPT_STARTED = "attempt_started"
STEP_LAUNCHED = "step_launched"
DETECTION = "detection"
INTERRUPTION = "interruption"
ACTION = "action"
CHECKPOINT_REQUESTED = "checkpoint_requested"
CHECKPOINT_COMMITTED = "checkpoint_committed"
ATTEMPT_ENDED = "attempt_ended"
CAMPAIGN_ENDED = "campaign_ended"
NODE_FORGIVEN = "node_forgiven"
CHECKPOINT_QUARANTINED = "checkpoint_quarantined"
CHECKPOINT_REFUSED = "checkpoint_refused"
CHECKPOINT_DIR_DECLARED = "checkpoint_dir_declared"
MEMORY_PICK = "memory_pick"
MEMORY_BUDDIES = "memory_buddies"
MEMORY_FLUSH = "memory_flush"
MEMORY_PERSIST = "memory_persist"
MEMORY_OFF = "memory_off"
STACKS = "stacks"
ENV_CHANGED = "env_changed"
NODES_EXCLUDED = "nodes_excluded"
AGENTS_MISSING = "agents_missing"
AGENTS_RESTARTED = "agents_restarted"
REQUEUE_SKIPPED = "requeue_skipped"
EXCLUSION_SKIPPED = "exclusion_skipped"
TIMEOUTS_LEARNED = "timeouts_learned"
SUPERVISOR_ERROR = "supervisor_error"
CHECKPOINT_MISSED = "checkpoint_missed"
STEP_PROGRESS = "step_progress"
CHECKPOINT_STALL = "checkpoint_stall"
PREFLIGHT = "preflight"
CHECKPOINT_INTERVAL = "checkpoint_interval"
HEALTH = "health"
NODE_LOSS_VERDICT = "node_loss_verdict"
FAILSAFE = "failsafe"
REQUEUE_EXPEDITED = "requeue_expedited"
SITE = "site"
WARM_RESTART_SKIPPED = "warm_restart_skipped"
WARM_RESTART_ORDERED = "warm_restart_ordered"
STANDBYS = "standbys"
JOURNAL_RESUMED = "journal_resumed"  # written by supervisor.journal itself; readers drop it

EVENT_TYPES: tuple[str, ...] = (
    CAMPAIGN_STARTED,
    ATTEMPT_STARTED,
    STEP_LAUNCHED,
    DETECTION,
    INTERRUPTION,
    ACTION,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_COMMITTED,
    ATTEMPT_ENDED,
    CAMPAIGN_ENDED,
    NODE_FORGIVEN,
    CHECKPOINT_QUARANTINED,
    CHECKPOINT_REFUSED,
    CHECKPOINT_DIR_DECLARED,
    MEMORY_PICK,
    MEMORY_BUDDIES,
    MEMORY_FLUSH,
    MEMORY_PERSIST,
    MEMORY_OFF,
    STACKS,
    NODES_EXCLUDED,
    AGENTS_MISSING,
    AGENTS_RESTARTED,
    WARM_RESTART_SKIPPED,
    WARM_RESTART_ORDERED,
    STANDBYS,
    REQUEUE_SKIPPED,
    EXCLUSION_SKIPPED,
    TIMEOUTS_LEARNED,
    SUPERVISOR_ERROR,
    CHECKPOINT_MISSED,
    STEP_PROGRESS,
    CHECKPOINT_STALL,
    PREFLIGHT,
    CHECKPOINT_INTERVAL,
    HEALTH,
    NODE_LOSS_VERDICT,
    FAILSAFE,
    REQUEUE_EXPEDITED,
    ENV_CHANGED,
    SITE,
)
# Written by ``supervisor.journal`` itself (never by the supervisor) and dropped by every reader.
STORAGE_EVENT_TYPES: tuple[str, ...] = (JOURNAL_RESUMED,)

TIERS: tuple[str, ...] = ("L1", "L2", "L3", "L4")

Event = dict[str, Any]


def _nodes(nodes: Iterable[str]) -> list[str]:
    return sorted(set(nodes))


def _check_in(value: str, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}: expected one of {', '.join(allowed)}")
    return value


def campaign_started(t: float, campaign: str, command: Sequence[str], job_id: str | None = None) -> Event:
    return {"type": CAMPAIGN_STARTED, "t": t, "campaign": campaign, "command": list(command), "job_id": job_id}


def attempt_started(
    t: float, job_id: str, restart: int, nodes: Iterable[str], resume_from: str | None
) -> Event:
    """One Slurm allocation run of the campaign (``restart`` is Slurm's restart count)."""
    return {
        "type": ATTEMPT_STARTED,
        "t": t,
        "job_id": job_id,
        "restart": restart,
        "nodes": _nodes(nodes),
        "resume_from": resume_from,
    }


def step_launched(
    t: float, launch: int, nodes: Iterable[str], excluded: Iterable[str] = (), resume_from: str | None = None
) -> Event:
    """One ``srun`` of the training step inside an attempt (``launch`` counts from 1 per attempt)."""
    return {
        "type": STEP_LAUNCHED,
        "t": t,
        "launch": launch,
        "nodes": _nodes(nodes),
        "excluded": _nodes(excluded),
        "resume_from": resume_from,
    }


def detection_event(detection: Any, t: float) -> Event:
    """Journal form of a :class:`supervisor.decisions.detect.DetectionEvent`."""
    event: Event = {"type": DETECTION, "t": t}
    event.update(detection.to_dict())
    return event


def interruption_event(
    t: float, cls: str, blamed_nodes: Iterable[str], confidence: float, evidence: Sequence[str]
) -> Event:
    _check_in(cls, OUTCOMES, "interruption class")
    return {
        "type": INTERRUPTION,
        "t": t,
        "class": cls,
        "blamed_nodes": _nodes(blamed_nodes),
        "confidence": confidence,
        "evidence": list(evidence),
    }


def action_event(
    t: float, kind: str, tier: str | None, target: Sequence[str], reason: str, params: Mapping[str, Any] | None = None
) -> Event:
    if tier is not None:
        _check_in(tier, TIERS, "tier")
    return {
        "type": ACTION,
        "t": t,
        "kind": kind,
        "tier": tier,
        "target": list(target),
        "reason": reason,
        "params": dict(params or {}),
    }


def checkpoint_requested(t: float, reason: str, step: int | None = None) -> Event:
    return {"type": CHECKPOINT_REQUESTED, "t": t, "reason": reason, "step": step}


def checkpoint_committed(t: float, step: int, path: str, duration_s: float | None = None) -> Event:
    """A checkpoint became valid (manifest committed): this is what counts as progress for budgets."""
    return {"type": CHECKPOINT_COMMITTED, "t": t, "step": step, "path": path, "duration_s": duration_s}


def attempt_ended(
    t: float,
    job_id: str,
    outcome: str,
    blamed_nodes: Iterable[str] = (),
    evidence: Sequence[str] = (),
    last_step: int | None = None,
) -> Event:
    _check_in(outcome, OUTCOMES, "attempt outcome")
    return {
        "type": ATTEMPT_ENDED,
        "t": t,
        "job_id": job_id,
        "outcome": {"class": outcome, "blamed_nodes": _nodes(blamed_nodes), "evidence": list(evidence)},
        "last_step": last_step,
    }


def campaign_ended(t: float, state: str, reason: str = "") -> Event:
    _check_in(state, CAMPAIGN_STATES, "campaign state")
    return {"type": CAMPAIGN_ENDED, "t": t, "state": state, "reason": reason}


def site(t: float, what: str, detail: str, nodes: Sequence[str] = ()) -> Event:
    """The site-wide node ledger (docs/site.md): ``what`` is ``excluded`` (the nodes the site holds as bad, left
    out of this launch), ``unavailable`` (it could not be asked or told: the campaign goes on with its own
    ledger; once per outage), ``reachable`` (again; what waited was sent), ``refused`` (it answered and refused
    one request, which is dropped) or ``off`` (its settings could not be used)."""
    return {"type": SITE, "t": t, "what": what, "detail": detail[:500], "nodes": sorted(nodes)[:256]}


def node_forgiven(t: float, node: str, by: str = "operator") -> Event:
    """An operator cleared a node's strikes (``supervise nodes --forgive``)."""
    return {"type": NODE_FORGIVEN, "t": t, "node": node, "by": by}


def checkpoint_quarantined(t: float, path: str, reason: str) -> Event:
    """A checkpoint was moved aside (torn, corrupt, or saved after the last finite loss); never deleted."""
    return {"type": CHECKPOINT_QUARANTINED, "t": t, "path": path, "reason": reason[:500]}


def checkpoint_refused(t: float, path: str, reason: str) -> Event:
    """A checkpoint this campaign did not sign was found where others can write (or adoption is off): it is
    never resumed from, nor moved; ``reason`` names the fix."""
    return {"type": CHECKPOINT_REFUSED, "t": t, "path": path, "reason": reason[:500]}


def checkpoint_dir_declared(t: float, path: str) -> Event:
    """The program said where it saves (``client.saves_to``; no command flag or config named it): the supervisor
    scans it from now on and relaunches resume from it."""
    return {"type": CHECKPOINT_DIR_DECLARED, "t": t, "path": path[:4096]}


def memory_pick(t: float, launch: int, step: int | None, why: str, fetches: int = 0,
                snapshot_launch: str = "") -> Event:  # fmt: skip
    """Before a relaunch: the memory snapshot it resumes from (``step``, written by launch ``snapshot_launch``), or
    None and why the filesystem tier is used (docs/checkpoints.md, memory tier)."""
    return {"type": MEMORY_PICK, "t": t, "launch": launch, "step": step, "why": why[:500], "fetches": fetches,
            "snapshot_launch": snapshot_launch[:64]}


def memory_flush(t: float, step: int | None, why: str, path: str = "", shards: int = 0, seconds: float = 0.0,
                 snapshot_launch: str = "") -> Event:  # fmt: skip
    """The job is stopping: the memory snapshot of ``step`` copied to the filesystem (committed at ``path``, the
    requeued job resumes from it), or None and why not (docs/checkpoints.md, memory tier)."""
    return {"type": MEMORY_FLUSH, "t": t, "step": step, "why": why[:500], "path": path, "shards": shards,
            "seconds": round(seconds, 3), "snapshot_launch": snapshot_launch[:64]}


def memory_persist(t: float, step: int | None, why: str, path: str = "", shards: int = 0,
                   seconds: float = 0.0) -> Event:  # fmt: skip
    """While the training ran, the node agents persisted the memory snapshot of ``step`` to ``path`` (what a
    fault the memory tier cannot answer resumes from), or None and why a persist failed (docs/checkpoints.md)."""
    return {"type": MEMORY_PERSIST, "t": t, "step": step, "why": why[:500], "path": path, "shards": shards,
            "seconds": round(seconds, 3)}


def memory_off(t: float, why: str, failed: dict[str, list[int]]) -> Event:
    """A node's memory store failed its ranks (too small, a write error): the campaign's memory snapshots are off
    from now on; ``failed`` names the nodes and their ranks (docs/checkpoints.md, memory tier)."""
    return {"type": MEMORY_OFF, "t": t, "why": why[:500],
            "failed": {str(n): sorted(int(r) for r in ranks)[:64] for n, ranks in sorted(failed.items())[:64]}}


def warm_restart_skipped(t: float, launch: int, why: str) -> Event:
    """A restart in the allocation that could not be warm (decisions/warm_restart.py says why): the launch is
    relaunched cold."""
    return {"type": WARM_RESTART_SKIPPED, "t": t, "launch": launch, "why": why[:500]}


def warm_restart_ordered(t: float, launch: int, generation: int, release_s: float, order_s: float) -> Event:
    """Every kept rank of warm launch ``launch`` took its restart order (now, ``t``): ``release_s`` from the
    interruption until every survivor had let go of the failed collective and waited, ``order_s`` from the order's
    sending until every kept rank took it (and each standby given a rank showed up as it). The report's recovery
    timings (decisions/recovery_timings.py) split a warm restart's time with it."""
    return {"type": WARM_RESTART_ORDERED, "t": t, "launch": launch, "generation": generation,
            "release_s": round(max(0.0, release_s), 3), "order_s": round(max(0.0, order_s), 3)}


def standbys(t: float, launch: int, started: Mapping[str, str], why: str = "") -> Event:
    """Standby ranks of a warm launch (decisions/standbys.py): ``started`` maps each new standby's id to its node;
    ``why``: none can be kept for this launch (said once)."""
    event: Event = {"type": STANDBYS, "t": t, "launch": launch, "started": dict(sorted(started.items()))}
    if why:
        event["why"] = why[:500]
    return event


def memory_buddies(t: float, ring: dict[str, str]) -> Event:
    """The memory tier's copies between nodes: ``ring`` maps each node to the node its snapshots are copied to."""
    return {"type": MEMORY_BUDDIES, "t": t, "ring": dict(sorted(ring.items()))}


def stacks(t: float, node: str | None, rank: int | None, result: str, detail: str | None = None) -> Event:
    """One rank's stack dump before a kill: ``result`` is ``stacks_saved`` or ``stacks_failed``."""
    return {"type": STACKS, "t": t, "node": node, "rank": rank, "result": result, "detail": detail}


def env_changed(t: float, checkpoint: str, differences: Sequence[str]) -> Event:
    """A launch resumed from ``checkpoint`` in another environment than the one that wrote it (decisions/env_drift.py)."""
    return {"type": ENV_CHANGED, "t": t, "checkpoint": checkpoint, "differences": list(differences)}


def nodes_excluded(t: float, nodes: Iterable[str], released: Iterable[str] = ()) -> Event:
    """The job's ExcNodeList was set to ``nodes`` (the whole list: Slurm replaces it); ``released``: nodes taken
    out of it (left out at submission for the site ledger, forgiven by the site since)."""
    out: Event = {"type": NODES_EXCLUDED, "t": t, "nodes": sorted(set(nodes))}
    if released:
        out["released"] = sorted(set(released))
    return out


def agents_missing(t: float, nodes: Iterable[str], reason: str) -> Event:
    """Node agents that did not report in time: ranks there run without heartbeats."""
    return {"type": AGENTS_MISSING, "t": t, "nodes": sorted(set(nodes)), "reason": reason}


def agents_restarted(t: float, nodes: Iterable[str]) -> Event:
    """The node agents' job step died and was started again on ``nodes``."""
    return {"type": AGENTS_RESTARTED, "t": t, "nodes": list(nodes)}


def requeue_skipped(t: float, reason: str) -> Event:
    """A requeue the policy asked for was not done (e.g. the job was cancelled: a user's stop is final)."""
    return {"type": REQUEUE_SKIPPED, "t": t, "reason": reason}


def exclusion_skipped(t: float, nodes: Iterable[str], reason: str) -> Event:
    """ExcNodeList was not written: the job's current list could not be read, and Slurm replaces the list, so
    writing ours alone would drop the user's own exclusions."""
    return {"type": EXCLUSION_SKIPPED, "t": t, "nodes": sorted(set(nodes)), "reason": reason}


def timeouts_learned(t: float, histograms: Mapping[str, Any], timeouts_s: Mapping[str, Any]) -> Event:
    """The detector's learned per-phase step-time histograms; the last one is restored by the next Slurm run."""
    return {"type": TIMEOUTS_LEARNED, "t": t, "histograms": dict(histograms), "timeouts_s": dict(timeouts_s)}


def supervisor_error(t: float, stage: str, error: str, repeats: int = 0) -> Event:
    """One stage of the supervisor failed (a detector, the live.json write, a checkpoint scan, a Slurm query, an
    actuator); supervision went on. ``repeats``: the same error suppressed since it was last journaled."""
    return {"type": SUPERVISOR_ERROR, "t": t, "stage": stage, "error": error[:500], "repeats": repeats}


def checkpoint_missed(t: float, reason: str, unreached_ranks: Sequence[int] = (), waited_s: float | None = None,
                      step: int | None = None) -> Event:
    """A requested checkpoint did not commit before the launch ended (or the wait ran out): the next run resumes
    from an older one (``step``: the newest valid one known). ``unreached_ranks``: ranks the request never
    reached (they had not started, or never used the client)."""
    return {"type": CHECKPOINT_MISSED, "t": t, "reason": reason, "unreached_ranks": sorted(unreached_ranks),
            "waited_s": waited_s, "step": step}


def step_progress(t: float, launch: int, step: int, step_t: float, ranks: int) -> Event:
    """The launch's slowest reporting rank had finished iteration ``step`` at ``step_t`` (wall time, from its
    beat age); ``ranks`` ranks reported. The first of a launch ends its start-up; the goodput ledger's record."""
    return {"type": STEP_PROGRESS, "t": t, "launch": launch, "step": step, "step_t": step_t, "ranks": ranks}


def checkpoint_stall(t: float, launch: int, step: int, stall_s: float, end_t: float, ranks: int) -> Event:
    """Ranks of the launch left a checkpoint phase at iteration ``step`` around ``end_t``; the slowest of the
    ``ranks`` that did spent ``stall_s`` in it (measured by the client, not estimated)."""
    return {"type": CHECKPOINT_STALL, "t": t, "launch": launch, "step": step, "stall_s": stall_s, "end_t": end_t,
            "ranks": ranks}


def preflight(t: float, nodes: Iterable[str], duration_s: float, unfit: Iterable[str] = (), *,
              launch: int | None = None, blamed_nodes: Iterable[str] = (), enough: bool = True,
              unfit_checks: Mapping[str, Sequence[str]] | None = None, slow: Mapping[str, str] | None = None,
              errors: Mapping[str, str] | None = None, skipped: str | None = None,
              figures: Mapping[str, Any] | None = None, allreduce_busbw_Bps: float | None = None,  # noqa: N803
              kept: Mapping[str, str] | None = None, retested: Sequence[str] = ()) -> Event:  # fmt: skip
    """Node checks before a launch took ``duration_s`` (ending at ``t``); ``unfit``: nodes they found broken.
    The supervisor's check before launch ``launch`` (driver/prelaunch.py) adds: ``unfit_checks`` (each health-unfit
    node's fatal checks), ``slow`` (nodes the collective test found markedly slow, and why), ``blamed_nodes``
    (both: left out of the launch when ``enough`` remain; the ledger strikes them), ``errors`` (ranks that failed
    the test: inconclusive, nobody blamed), ``skipped`` (why the test did not run, or None), ``figures``, and
    ``kept`` (nodes slower than their peers but not worth leaving out, and why: decisions/slow_nodes.py), and
    ``retested`` (nodes measured again because the last verdict blamed them for a fault that could hurt a node)."""
    return {"type": PREFLIGHT, "t": t, "nodes": _nodes(nodes), "duration_s": duration_s, "unfit": _nodes(unfit),
            "launch": launch, "blamed_nodes": _nodes(blamed_nodes), "enough": enough,
            "unfit_checks": {n: list(c) for n, c in (unfit_checks or {}).items()}, "slow": dict(slow or {}),
            "errors": dict(errors or {}), "skipped": skipped, "figures": dict(figures or {}),
            "allreduce_busbw_Bps": allreduce_busbw_Bps, "kept": dict(kept or {}), "retested": list(retested)}


def checkpoint_interval(t: float, setting: str, advice: Mapping[str, Any]) -> Event:
    """The checkpoint interval the supervisor asks the ranks for changed (``[run] checkpoint_interval``):
    ``advice`` is ``checkpoint_interval.Advice.to_dict()`` (interval, mode, stall, restart, MTBF and its source,
    predicted and optimal goodput)."""
    return {"type": CHECKPOINT_INTERVAL, "t": t, "setting": setting, **dict(advice)}
def health(t: float, node: str, nvml: str, findings: Sequence[Mapping[str, Any]], unfit: bool) -> Event:
    """A node agent's health check changed what it finds on ``node`` (a problem appeared or went away): each
    finding is ``{severity, check, value, threshold, what, fix}``; ``unfit``: a fatal finding makes the node
    unfit for training (it is blamed when it is in the launch); ``nvml``: "ok" or why there is no GPU reading."""
    return {"type": HEALTH, "t": t, "node": node, "nvml": nvml, "unfit": unfit,
            "findings": [dict(f) for f in findings]}


def journal_resumed(t: float, torn_offset: int) -> Event:
    """A writer reopened a journal whose last line was torn: the fragment at ``torn_offset`` is sealed off."""
    return {"type": JOURNAL_RESUMED, "t": t, "torn_offset": torn_offset}


def node_loss_verdict(t: float, verdict: str, nodes: Iterable[str], silent_s: float, timeout_s: float,
                      confirmed_by: str | None = None, detail: str = "") -> Event:
    """The supervisor's own judgement of a silent node (``decisions/nodeloss.py``): ``lost`` (silent past the
    learned ``timeout_s`` and confirmed ``by`` the probe or Slurm's NOT_RESPONDING), ``alive`` (the probe got
    through) or ``ours`` (every node silent at once: the supervisor's side, nobody blamed)."""
    return {"type": NODE_LOSS_VERDICT, "t": t, "verdict": verdict, "nodes": sorted(set(nodes)),
            "silent_s": round(silent_s, 3), "timeout_s": round(timeout_s, 3), "confirmed_by": confirmed_by,
            "detail": detail[:300]}


def failsafe(t: float, node: str, action: str, batch_host: str | None, job_id: str, reason: str,
             exclude: Sequence[str] = ()) -> Event:
    """A node agent found the supervisor gone (no control frames past its timeout, the batch host not
    answering) and acted for it: ``action`` is ``requeue`` (with ``exclude``) or ``cancel`` (requeue refused)."""
    return {"type": FAILSAFE, "t": t, "node": node, "action": action, "batch_host": batch_host, "job_id": job_id,
            "reason": reason[:300], "exclude": sorted(set(exclude))}


def requeue_expedited(t: float, dropped: Iterable[str], start_in_s: float | None, errors: Sequence[str] = ()) -> Event:
    """A requeue after a node loss, sped up: ``dropped`` nodes were taken out of the running allocation first (so
    the job completes without waiting for Slurm to mark them DOWN), the requeued job's StartTime was set to
    ``start_in_s`` seconds later (instead of Slurm's cred_expire + 1 s), ``errors``: what was not done and why."""
    return {"type": REQUEUE_EXPEDITED, "t": t, "dropped": sorted(set(dropped)), "start_in_s": start_in_s,
            "errors": list(errors)}  # fmt: skip
