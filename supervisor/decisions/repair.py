"""The site's repair loop, as a plan (issue 24; operator opt-in, ``supervise site serve --repair``): which nodes to
drain, which to reboot, which to return to service. Pure: the service passes Slurm's view of the nodes, the
verdicts that count against each node for everyone (``decisions/site_trust.py``: read from the node or from
Slurm), the lemons, the operators' forgiveness and what the loop itself did before; the driver carries it out.

* A node held as bad for everyone — a hardware verdict read from the node or by Slurm since it was last
  forgiven, or a lemon — is **drained**, with a reason that names the evidence and starts with ``REASON_TAG`` (so
  the loop only ever touches what it drained itself: a node an operator drained is theirs).
* A node the loop drained for an Xid a GPU reset or a node reboot fixes (NVIDIA's catalogue: ECC errors awaiting a
  reset, a GPU fallen off the bus, GPU firmware errors, ...) is **rebooted** once (``scontrol reboot ASAP
  nextstate=RESUME``): the node's own health check (Slurm's HealthCheckProgram: ``supervise healthcheck --drain``)
  drains it again if it is still unfit. A lemon is never rebooted: a node that keeps failing needs a person.
* A node the loop drained is **resumed** once an operator forgave it (``supervise site forgive``), and forgiven
  by the loop itself when it came back from the loop's reboot fit: up and not drained again by its health check
  for a whole health-check interval (``health_wait_s``: Slurm resumes a rebooted node at once, nextstate=RESUME,
  and its HealthCheckProgram drains it again only at its next run). A node the health check drained is the
  health check's: once the check passes and resumes it, the wait starts again.
* Never more than ``max_drained_fraction`` of the nodes Slurm lists are held drained by the loop at once: a rule
  gone wrong (or a bad switch blamed on every node behind it) must not empty the cluster; the rest wait, listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

REASON_TAG = "supervise-site:"
# Xid codes whose remedy is a GPU reset or a node reboot (NVIDIA, "Xid Errors", immediate actions; and "GPU
# Memory Error Management" for 48/63/94/95): a reboot may return the node; the others (64: replace the GPU,
# 74 NVLink, 92 a high single-bit error rate, 140) need a person.
REBOOT_FIXES = frozenset({48, 61, 62, 63, 79, 94, 95, 119, 120, 143, 154})
_XID = re.compile(r"\bXid (\d{1,4})\b")


@dataclass(frozen=True)
class NodeNow:
    """Slurm's view of one node: its base state, whether it is drained/draining, and its reason."""

    node: str
    state: str
    drained: bool
    reason: str | None


@dataclass(frozen=True)
class Held:
    """Why a node counts as bad for everyone: its evidence lines (newest first) and whether it is a lemon."""

    evidence: tuple[str, ...]
    lemon: bool = False


BACK_WAIT = "back from the repair loop's reboot: its health check has an interval to find it unfit"
HEALTH_DRAINED = "drained by its health check after the repair loop's reboot"


@dataclass(frozen=True)
class RepairConfig:
    max_drained_fraction: float = 0.1
    reboot: bool = True
    health_wait_s: float = 0.0  # HealthCheckInterval + a margin when Slurm runs a HealthCheckProgram, else 0

    def __post_init__(self) -> None:
        if not 0 < self.max_drained_fraction <= 1:
            raise ValueError(f"repair max_drained_fraction must be in (0, 1], got {self.max_drained_fraction!r}")


@dataclass(frozen=True)
class Step:
    kind: str  # "drain", "reboot", "resume", "forgive", "wait"
    node: str
    reason: str


def ours(now: NodeNow) -> bool:
    return now.drained and (now.reason or "").startswith(REASON_TAG)


def reboot_fixes(evidence: Iterable[str]) -> int | None:
    """The Xid code in ``evidence`` that a reboot fixes, if every Xid named there is one (None otherwise)."""
    found = [int(m) for line in evidence for m in _XID.findall(line)]
    return found[0] if found and all(code in REBOOT_FIXES for code in found) else None


def plan(nodes: Mapping[str, NodeNow], held: Mapping[str, Held], forgiven: set[str], rebooted: set[str],
         config: RepairConfig | None = None, back_since: Mapping[str, float] | None = None,
         now_t: float = 0.0) -> list[Step]:  # fmt: skip
    """The steps for this round. ``held``: node -> why it counts as bad for everyone now; ``forgiven``: nodes an
    operator forgave since the loop drained them; ``rebooted``: nodes the loop has rebooted since it drained them;
    ``back_since``: when the loop last recorded a rebooted node back and undrained (its ``BACK_WAIT`` step, not
    followed by ``HEALTH_DRAINED``); ``now_t``: the time of this round."""
    c = config or RepairConfig()
    back = back_since or {}
    steps: list[Step] = []
    drained_by_us = {n for n, now in nodes.items() if ours(now)}
    room = int(c.max_drained_fraction * len(nodes)) - len(drained_by_us)
    for node in sorted(nodes):
        now = nodes[node]
        if node in rebooted and now.drained and not ours(now):
            steps.append(Step("wait", node, HEALTH_DRAINED))  # (recorded once: the wait starts again when back)
            continue
        if node in rebooted and not now.drained and now.state not in ("DOWN", "UNKNOWN"):
            # back from the loop's reboot (nextstate=RESUME): fit once its health check had an interval to say not
            if c.health_wait_s > 0 and now_t - back.get(node, now_t) < c.health_wait_s:
                steps.append(Step("wait", node, BACK_WAIT))
            else:
                steps.append(Step("forgive", node, "back from the repair loop's reboot, its health check passed"))
            continue
        if node in drained_by_us:
            if node in forgiven:
                steps.append(Step("resume", node, "an operator forgave it"))
            elif c.reboot and node in held and node not in rebooted and not held[node].lemon:
                code = reboot_fixes(held[node].evidence)
                if code is not None:
                    steps.append(Step("reboot", node, f"{REASON_TAG} Xid {code}: a reboot may fix it"))
            continue
        if node not in held or now.drained or now.state == "DOWN":
            continue  # fit, or someone else's drain, or down already: nothing of ours to do
        why = held[node]
        first = why.evidence[0] if why.evidence else "no evidence line"
        reason = f"{REASON_TAG} {'lemon: ' if why.lemon else ''}{first}"[:200]
        if room <= 0:
            steps.append(Step("wait", node, f"not drained: {c.max_drained_fraction:.0%} of the nodes are drained by "
                                            f"the repair loop already ({reason})"))  # fmt: skip
            continue
        room -= 1
        steps.append(Step("drain", node, reason))
    return steps
