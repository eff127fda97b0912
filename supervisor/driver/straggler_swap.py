"""The straggler swap's driver: on a straggler warning, gathers what the pure rule needs (the launch's step
period, the free spares, the measured restart and checkpoint stall, the swap budget) and asks
``decisions.straggler_swap.judge``. The watch ends the launch on a swap; the loop answers it with
``decisions.straggler_swap.respond`` (checkpoint and stop, relaunch without the node)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions import straggler_swap as rule
from supervisor.decisions.campaign_state import CampaignState
from supervisor.decisions.detect.findings import STRAGGLER, DetectionEvent
from supervisor.decisions.slow_nodes import Costs


class SwapJudge:
    def __init__(self, *, state: CampaignState, policy_config: policy.PolicyConfig, factor: float, costs: Costs,
                 spares: Callable[[Iterable[str], float], int], clock: Callable[[], float]) -> None:  # fmt: skip
        """``spares(launch_nodes, now)``: the allocation's usable nodes outside the launch and the ledger's
        exclusions."""
        self.state, self.policy_config, self.factor, self.costs = state, policy_config, factor, costs
        self.spares, self.clock = spares, clock

    def judge(self, detection: DetectionEvent, live: Any, launch_nodes: Iterable[str]) -> rule.Verdict | None:
        """The verdict on a straggler warning (None for any other warning)."""
        if detection.kind != STRAGGLER:
            return None
        now = self.clock()
        periods = [r.ewma_s for r in getattr(live, "ranks", ()) if getattr(r, "ewma_s", None)]
        measured = self.state.interval.measured(now)
        history = self.state.history.record(ev.STRAGGLER, now)  # as if this swap happened: is it within budget?
        return rule.judge(detection, factor=self.factor, period_s=statistics.median(periods) if periods else None,
                          spares_free=self.spares(launch_nodes, now), restart_s=measured.restart_s,
                          stall_s=measured.delta_s, over_budget=policy.over_budget(ev.STRAGGLER, history,
                                                                                   self.policy_config, now),
                          costs=self.costs)  # fmt: skip
