"""Operator mode: drain this node when a check fails, resume it when healthy again, only if we drained it.

Pure :func:`decide` over (the node's Slurm state, the problems found); :func:`apply` carries the decision out
through the slurm adapter. Ownership of a drain is the reason's prefix ``supervise:`` (nodes the supervisor's
policy drains say ``supervisor: <class>`` and nodes an admin drained say anything else: neither is resumed
here). A failed Slurm query is "unknown": nothing is drained or resumed on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.health.checks import FATAL, Problem

PREFIX = "supervise:"
MAX_REASON = 256


@dataclass(frozen=True)
class DrainDecision:
    action: str  # "drain" | "resume" | "none"
    reason: str = ""  # the drain reason, or why nothing is done
    node: str = ""


def reason_for(problems: list[Problem]) -> str:
    fatal = [p for p in problems if p.severity == FATAL]
    text = fatal[0].reason() if fatal else ""
    if len(fatal) > 1:
        text += f" +{len(fatal) - 1} more"
    return " ".join(text.split())[:MAX_REASON]


def decide(node: str, node_info: Any, problems: list[Problem]) -> DrainDecision:
    """``node_info``: a ``slurm.model.NodeInfo`` (``is_drain``, ``reason``) or None when Slurm does not know it."""
    if node_info is None:
        return DrainDecision("none", f"Slurm does not know node {node!r}: pass --node with its Slurm name", node)
    ours = (node_info.reason or "").startswith(PREFIX)
    unfit = any(p.severity == FATAL for p in problems)
    if unfit:
        reason = reason_for(problems)
        if node_info.is_drain and not ours:
            return DrainDecision("none", f"already drained by someone else ({node_info.reason}); left alone", node)
        if node_info.is_drain and node_info.reason == reason:
            return DrainDecision("none", "already drained for this reason", node)
        return DrainDecision("drain", reason, node)
    if node_info.is_drain and ours:
        return DrainDecision("resume", f"healthy again (was: {node_info.reason})", node)
    if node_info.is_drain:
        return DrainDecision("none", f"drained by someone else ({node_info.reason}); not resumed", node)
    return DrainDecision("none", "healthy", node)


def apply(client: Any, decision: DrainDecision) -> None:
    """Raises the slurm adapter's typed errors (the caller reports them)."""
    if decision.action == "drain":
        client.drain([decision.node], decision.reason)
    elif decision.action == "resume":
        client.resume([decision.node])
