"""From one complete :class:`~supervisor.decisions.classify.Evidence` to a decision: classify, then ask the policy.

Pure: the loop hands in the evidence it gathered about one ending and the campaign state folded from the
journal; this module returns the interruption and the one thing to do next. Nothing here touches Slurm,
sockets or files.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm.model import JobInfo
from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, LogSignature


def job_state_of(job: JobInfo | None, scheduled_end: float | None) -> str | None:
    """The job's state as evidence. Slurm 22.05 shows a cancelled job only as COMPLETING, with EndTime moved to
    the moment of the cancel: an end well before the scheduled one, without a preemption or a requeue, is a
    cancel (a time limit keeps its EndTime, a requeue bumps the restart count and a preemption sets PreemptTime)."""
    if job is None:
        return None
    state = job.base_state or job.state
    if state != "COMPLETING" or scheduled_end is None or job.preempt_time:
        return state
    end = job.end_time
    if end is not None and end < scheduled_end - 30:
        return "CANCELLED"
    return state


def last_step(evidence: cl.Evidence) -> int | None:
    """The newest iteration any rank of the ended launch reported."""
    return max(evidence.last_steps.values()) if evidence.last_steps else None


def respond(
    evidence: cl.Evidence,
    history: policy.History,
    ledger: Ledger,
    *,
    nodes: tuple[str, ...],
    needed: int,
    config: policy.PolicyConfig,
    now: float,
    step_running: bool,
    restarts_here: int = 0,
    signatures: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES,
    slurm_kills_on_node_failure: bool = True,
    min_needed: int | None = None,
) -> tuple[cl.Interruption, policy.Decision]:
    """Classify what ended (or must end) the launch and ask the policy what to do.

    ``history`` and ``ledger`` are the campaign so far (``campaign_state.fold``), without this interruption.
    ``slurm_kills_on_node_failure`` is False for jobs submitted with ``--no-kill`` (spare nodes): Slurm then
    keeps the job running without the dead node, and recovery inside the allocation is ours to do; otherwise a
    lost node means a requeue at once. ``min_needed``: the fewest nodes the training may go on with when the
    spares are used up (``[run] min_nodes``; None: never fewer than ``needed``)."""
    interruption = cl.classify(evidence, signatures)
    slurm_requeues = (
        slurm_kills_on_node_failure
        and interruption.cls == ev.NODE_FAILURE
        and any(evidence.slurm_nodes[n].is_down for n in nodes if n in evidence.slurm_nodes)
    )
    allocation = policy.Allocation(
        nodes=nodes, needed=needed, excluded=ledger.excluded_nodes(now),
        step_running=step_running, slurm_requeues=slurm_requeues, restarts_here=restarts_here,
        min_needed=min_needed, node_loss_ends_job=slurm_kills_on_node_failure,
    )  # fmt: skip
    decision = policy.decide(interruption, history, allocation, config, now=now)
    return interruption, decision
