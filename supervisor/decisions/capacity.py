"""Whether a requeued job could ever start again with the nodes it is about to exclude. Pure.

Why: a job's ExcNodeList only grows (the user's own, earlier runs', each requeue's blamed nodes). Once the job's
partitions hold fewer nodes outside it than the job asks for, Slurm keeps the job pending for ever
(``BadConstraints``/``ReqNodeNotAvail``) while the campaign looks merely pending, and nobody is told. So, before a
requeue: the soft suspects (a hang's or a communication error's node, not excluded by the ledger) are dropped from
the exclusion when that is enough for the job to start; otherwise the job is requeued *held* and the campaign says
in one line which nodes are excluded and why, and how to forgive them.

"Never" is claimed only on complete evidence: every node of the partitions counted whatever its state (a DOWN node
may come back; a drained one with an operator), the job's own ExcNodeList read from Slurm. When Slurm did not
answer, the requeue goes ahead as before (unknown is not "too few").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from supervisor.decisions import policy

LISTED = 8  # excluded nodes named in the one line; the rest are counted


@dataclass(frozen=True)
class Room:
    """The job's place in Slurm when it is about to be requeued."""

    partition: str  # the job's partition(s), as Slurm writes them (``batch`` or ``a,b``)
    nodes: frozenset[str]  # every node of those partitions, whatever its state
    job_nodes: int  # nodes the job asks for at each start
    job_excluded: frozenset[str] = frozenset()  # its ExcNodeList now (the user's own and earlier runs')


def left_after(room: Room, exclude: frozenset[str]) -> frozenset[str]:
    """The partitions' nodes the requeued job could still be given."""
    return room.nodes - room.job_excluded - exclude


REQUEUES = (policy.REQUEUE, policy.AWAIT_REQUEUE)


def requeues(decision: policy.Decision) -> bool:
    """Whether the decision puts the job back in the queue (then its room is worth asking Slurm for)."""
    return any(a.kind in REQUEUES for a in decision.actions)


def fit_requeue(decision: policy.Decision, room: Room | None, *, hard: frozenset[str],
                reasons: Mapping[str, str], forgive_hint: str) -> policy.Decision:  # fmt: skip
    """The decision, changed only when its requeue could never start: first without the soft suspects (the nodes
    of its exclusion that are not in ``hard``: this interruption's hard blame and the ledger's exclusions), else
    held with one line naming the excluded nodes (``reasons``: why each was left out) and ``forgive_hint``.
    ``room`` None (Slurm did not say): unchanged."""
    if room is None or room.job_nodes <= 0:
        return decision
    actions = list(decision.actions)
    for i, action in enumerate(actions):
        if action.kind not in REQUEUES:
            continue
        exclude = frozenset(action.params.get("exclude", ()))
        if len(left_after(room, exclude)) >= room.job_nodes:
            continue
        soft = exclude - hard - room.job_excluded
        if soft and len(left_after(room, exclude - soft)) >= room.job_nodes:
            kept = sorted(exclude - soft)
            note = f"; {', '.join(sorted(soft))} not excluded: the partition would be too small without them"
            actions[i] = replace(action, target=tuple(kept) if action.target else action.target,
                                 reason=action.reason + note, params={**action.params, "exclude": kept})  # fmt: skip
            return replace(decision, actions=tuple(actions), message=decision.message + note)
        message = held_line(room, exclude, reasons, forgive_hint)
        held = replace(action, kind=policy.HOLD, reason=message) if action.kind == policy.REQUEUE else \
            replace(action, reason=message, params={**action.params, "hold": True})  # fmt: skip
        actions[i] = held
        if not any(a.kind == policy.ALERT and (a.tier or "L1") >= "L2" for a in actions):
            actions.insert(0, policy.Action(policy.ALERT, "L2", (), message))
        return policy.Decision(tuple(actions), "held", message)
    return decision


def held_line(room: Room, exclude: frozenset[str], reasons: Mapping[str, str], forgive_hint: str) -> str:
    """One line: the partition is too small without the excluded nodes; which ones, why, how to forgive them."""
    out = sorted((room.job_excluded | exclude) & room.nodes)
    named = [f"{n} ({reasons.get(n) or ('excluded by the job' if n in room.job_excluded else 'blamed')})"
             for n in out[:LISTED]]  # fmt: skip
    more = f" and {len(out) - LISTED} more" if len(out) > LISTED else ""
    left = len(left_after(room, exclude))
    return (f"held: the job needs {room.job_nodes} nodes and partition {room.partition} has {len(room.nodes)}, "
            f"{len(out)} of them excluded ({'; '.join(named)}{more}), leaving {left}: Slurm would never start it; "
            f"{forgive_hint}")  # fmt: skip
