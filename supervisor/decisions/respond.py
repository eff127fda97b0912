"""From "the training step stopped (or must stop)" to a decision: gather evidence, classify, apply the policy.

Pure: the loop hands in what it observed (a ``StepEnding``) and the journal so far; this module returns the
events to journal and the one thing to do next. Nothing here touches Slurm, sockets or files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.detect import DetectionEvent
from supervisor.decisions.ledger import Ledger


@dataclasses.dataclass(frozen=True)
class StepEnding:
    """What the loop saw when it stopped watching a training step."""

    reason: str  # "exited" | "detection" | "signal"
    launch: int
    now: float
    exit_code: int | None = None  # srun's
    detections: tuple[DetectionEvent, ...] = ()
    signals: tuple[str, ...] = ()  # names the batch step received ("SIGUSR1", "SIGTERM")
    signal_times: tuple[float, ...] = ()
    job: Any = None  # slurm.model.JobInfo or None
    nodes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # allocation node -> "up"/"down"/"drain"
    log_tail: tuple[str, ...] = ()
    step_nodes: tuple[str, ...] = ()
    last_steps: Mapping[int, int] = dataclasses.field(default_factory=dict)  # rank -> last step seen
    rank_exits: tuple[cl.RankExit, ...] = ()
    sigterm_ranks: tuple[int, ...] = ()
    hung: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # node -> hung ranks
    signal_lead_s: float = 120.0
    scheduled_end: float | None = None  # the job's EndTime when this run started (its time limit)


def job_state_of(job: Any, scheduled_end: float | None) -> str | None:
    """The job's state as evidence. Slurm 22.05 shows a cancelled job only as COMPLETING, with EndTime moved to
    the moment of the cancel: an end well before the scheduled one, without a preemption or a requeue, is a
    cancel (a time limit keeps its EndTime, a requeue bumps the restart count and a preemption sets PreemptTime)."""
    state = getattr(job, "base_state", None) or getattr(job, "state", None)
    if job is None or state != "COMPLETING" or scheduled_end is None or getattr(job, "preempt_time", None):
        return state
    end = getattr(job, "end_time", None)
    if end is not None and end < scheduled_end - 30:
        return "CANCELLED"
    return state


def evidence_from(ending: StepEnding) -> cl.Evidence:
    job = ending.job
    log_lines = tuple(cl.LogLine(text=line) for line in ending.log_tail)
    rank_exits = ending.rank_exits
    if not rank_exits and ending.exit_code is not None:
        rank_exits = tuple(cl.RankExit(node=n, exit_code=ending.exit_code) for n in ending.step_nodes[:1])
    return cl.Evidence(
        job_state=job_state_of(job, ending.scheduled_end),
        job_reason=getattr(job, "reason", None),
        end_time=getattr(job, "end_time", None),
        scheduled_end=ending.scheduled_end,
        allocation_nodes=ending.step_nodes,  # (a silent agent blames its node only when the step's nodes are known)
        preempt_time=getattr(job, "preempt_time", None),
        batch_signals=tuple((s.removeprefix("SIG"), t) for s, t in zip(ending.signals, ending.signal_times, strict=False)),
        signal_lead_s=ending.signal_lead_s,
        sigterm_ranks=ending.sigterm_ranks,
        rank_exits=rank_exits,
        node_states={n: s.upper() for n, s in ending.nodes.items()},
        detections=tuple((ending.now, d) for d in ending.detections),
        log_lines=log_lines,
    )


def last_step(ending: StepEnding) -> int | None:
    return max(ending.last_steps.values()) if ending.last_steps else None


def infer_previous_outcome(
    history: Sequence[dict[str, Any]], node_states: Mapping[str, str], job: Any = None
) -> list[dict[str, Any]]:
    """When a run ended without its supervisor recording how (Slurm requeued or killed the whole job, e.g. a
    node failure took the batch host down), infer the outcome now so the report and the ledger stay true.

    Returns the events to journal (an interruption and the attempt's end), stamped with the last time the
    previous run was heard of."""
    last_attempt = None
    last_seen = 0.0
    for e in history:
        if e["type"] == ev.ATTEMPT_STARTED:
            last_attempt = e
        elif e["type"] in (ev.ATTEMPT_ENDED, ev.CAMPAIGN_ENDED):
            last_attempt = None
        last_seen = float(e.get("t", last_seen))
    if last_attempt is None:
        return []
    nodes = last_attempt.get("nodes", [])
    down = sorted(n for n in nodes if node_states.get(n) == "down")
    silent: set[str] = set()
    for e in history:
        if e["type"] == ev.DETECTION and e.get("kind") == "node_silent" and e["t"] >= last_attempt["t"]:
            silent.update(e.get("nodes", []))
    if down or silent:
        blamed = down or sorted(silent)
        cls, confidence = ev.NODE_FAILURE, 0.9 if down else 0.6
        evidence = [f"node {n} is DOWN/NOT_RESPONDING in Slurm after the previous run ended" for n in down]
        evidence += [f"node agent on {n} went silent before the previous run ended" for n in sorted(silent)]
    elif job is not None and getattr(job, "preempt_time", None):
        blamed, cls, confidence = [], ev.PREEMPTION, 0.8
        evidence = [f"Slurm recorded a preemption time {job.preempt_time} for the job"]
    else:
        blamed, cls, confidence = [], ev.UNKNOWN, 0.1
        evidence = ["the previous run ended without a word from its supervisor (killed with the job?)"]
    return [
        ev.interruption_event(last_seen, cls, blamed, confidence, evidence),
        ev.attempt_ended(last_seen, last_attempt["job_id"], cls, blamed, evidence),
    ]


def respond(
    ending: StepEnding,
    history: Sequence[dict[str, Any]],
    nodes: tuple[str, ...],
    needed: int,
    config: policy.PolicyConfig,
    ledger: Ledger,
    step_running: bool,
    restarts_here: int = 0,
    signatures: Sequence[cl.LogSignature] = cl.DEFAULT_LOG_SIGNATURES,
    slurm_kills_on_node_failure: bool = True,
) -> tuple[cl.Interruption, policy.Decision]:
    """Classify what ended (or must end) the step and ask the policy what to do.

    ``slurm_kills_on_node_failure`` is False for jobs submitted with ``--no-kill`` (spare nodes): Slurm then
    keeps the job running without the dead node, and recovery inside the allocation is ours to do."""
    past = policy.History.fold(history)
    interruption = cl.classify(dataclasses.replace(evidence_from(ending), app_error_history=past.app_error_origins),
                               signatures)  # fmt: skip
    slurm_requeues = (
        slurm_kills_on_node_failure
        and interruption.cls == ev.NODE_FAILURE
        and any(ending.nodes.get(n) == "down" for n in nodes)
    )
    allocation = policy.Allocation(
        nodes=nodes, needed=needed, excluded=ledger.excluded_nodes(ending.now),
        step_running=step_running, slurm_requeues=slurm_requeues, restarts_here=restarts_here,
    )  # fmt: skip
    decision = policy.decide(interruption, past, allocation, config, now=ending.now)
    return interruption, decision
