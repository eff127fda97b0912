"""Whether to swap a persistent straggler out for a spare now, or keep it (alert and strike, as before). Pure.

A straggler sets the pace of every synchronous step; the only cure the supervisor has is a relaunch without its
node, which costs a checkpoint, a restart and a spare node. So the rule compares what each costs over the next
``horizon_s`` (the ``[preflight]`` cost model's horizon, one hour by default: how long a kept slow node slows the
training before something else replaces it anyway):

* keeping it: the training runs ``excess`` seconds longer each step, ``excess`` being the straggler's own time
  less its peers' median; that is ``horizon_s * excess / period_s`` of the horizon (``period_s``: the common step
  period, which carries the excess);
* swapping it: the checkpoint stall + the measured restart (interruption to the first resumed step; the
  campaign's median, or ``restart_default_s`` before it has restarted) + the spare it takes (``spare_share`` of
  the horizon: the next node loss then costs a requeue).

It swaps only when keeping costs more, a spare is free, and the swap budget (``policy.budgets.straggler``: swaps
since the last progress) is not spent; otherwise the warning stays a warning. The interruption it makes has the
outcome ``straggler`` (``events.RESTART_CLASSES``, not one of the classifier's classes): not a fault (no crash-loop
count, no backoff); its node is struck by ``ledger.weights.straggler``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.detect.findings import STRAGGLER, DetectionEvent
from supervisor.decisions.interruption import PROGRAM, Interruption
from supervisor.decisions.slow_nodes import DEFAULT_COSTS, Costs

RESTART_DEFAULT_S = 120.0  # before the campaign has measured one of its own restarts


@dataclass(frozen=True)
class Verdict:
    swap: bool
    keep_cost_s: float  # what the straggler costs over the horizon if kept
    swap_cost_s: float  # what swapping it out costs
    why: str  # one line, for the journal and the alert


def keep_cost_s(own_s: float, peers_s: float, period_s: float, horizon_s: float) -> float:
    """Seconds of the horizon the straggler's excess takes if it stays (0 when it is not slower)."""
    excess = own_s - peers_s
    if not all(map(math.isfinite, (own_s, peers_s, period_s, horizon_s))) or excess <= 0 or horizon_s <= 0:
        return 0.0
    return horizon_s * min(1.0, excess / max(period_s, own_s))


def swap_cost_s(restart_s: float | None, stall_s: float | None, costs: Costs = DEFAULT_COSTS) -> float:
    """Seconds a swap costs: the checkpoint stall, the restart, and the spare it uses up."""
    restart = restart_s if restart_s is not None and math.isfinite(restart_s) and restart_s >= 0 else RESTART_DEFAULT_S
    stall = stall_s if stall_s is not None and math.isfinite(stall_s) and stall_s >= 0 else 0.0
    return restart + stall + costs.spare_share * costs.horizon_s


def judge(detection: DetectionEvent, *, factor: float, period_s: float | None, spares_free: int,
          restart_s: float | None, stall_s: float | None, over_budget: str | None,
          costs: Costs = DEFAULT_COSTS) -> Verdict:  # fmt: skip
    """The swap verdict on a straggler ``detection`` (its value: the rank's time; its threshold: ``factor`` x
    the peers' median). ``period_s``: the launch's step period (None: the rank's own time is taken)."""
    if detection.kind != STRAGGLER or detection.value is None or detection.threshold is None or not detection.nodes:
        return Verdict(False, 0.0, 0.0, "not a straggler finding with its figures")
    own, peers = detection.value, detection.threshold / factor
    kept = keep_cost_s(own, peers, period_s if period_s and period_s > 0 else own, costs.horizon_s)
    swap = swap_cost_s(restart_s, stall_s, costs)
    figures = f"kept, it costs ~{kept:.0f}s of the next {costs.horizon_s:.0f}s; a swap ~{swap:.0f}s"
    if over_budget is not None:
        return Verdict(False, kept, swap, f"{figures}; not swapped: {over_budget}")
    if spares_free < 1:
        return Verdict(False, kept, swap, f"{figures}; not swapped: no spare node is free")
    if kept <= swap:
        return Verdict(False, kept, swap, f"{figures}; kept")
    return Verdict(True, kept, swap, f"{figures}; swapped for a spare")


def respond(detection: DetectionEvent, verdict: Verdict, config: policy.PolicyConfig) -> tuple[Interruption, policy.Decision]:
    """The interruption (class ``straggler``, its node blamed) and the decision for a swap: an L3 alert, every
    rank asked to checkpoint and exit (killed after ``stop_grace_s``), a relaunch in this allocation without the
    node (the spare takes its place)."""
    nodes = tuple(detection.nodes)
    line = f"{detection.evidence[0] if detection.evidence else 'straggler'}; {verdict.why}"
    interruption = Interruption(ev.STRAGGLER, nodes, 0.9, (line,), origin_nodes=nodes,
                                origin_ranks=tuple(detection.ranks), witnesses=(PROGRAM,))  # its client timed it  # fmt: skip
    why = f"{ev.STRAGGLER}: {line}"
    actions = (
        policy.Action(policy.ALERT, "L3", nodes, why, {"class": ev.STRAGGLER, "confidence": 0.9,
                                                       "suggested_action": "none needed: the node is left out of the "
                                                       "relaunch and struck in the ledger; drain it if it stays slow"}),
        policy.Action(policy.STOP_STEP, "L3", (), why, {"checkpoint": True, "grace_s": config.stop_grace_s}),
        policy.Action(policy.RESTART_IN_ALLOCATION, None, nodes, f"{ev.STRAGGLER}: relaunch without {', '.join(nodes)}",
                      {"exclude": list(nodes)}),
    )  # fmt: skip
    return interruption, policy.Decision(actions, "running", f"straggler on {', '.join(nodes)} swapped for a spare")
