"""The straggler swap (decisions/straggler_swap.py, driver/straggler_swap.py): the cost rule as properties (never
without a spare or past the budget; a swap exactly when keeping costs more), the decision it makes (checkpoint,
stop, relaunch without the node; not a fault), and the driver's inputs read from a real campaign state."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions import straggler_swap as rule
from supervisor.decisions.campaign_state import CampaignState
from supervisor.decisions.detect.findings import LOSS_SPIKE, STRAGGLER, DetectionEvent
from supervisor.decisions.slow_nodes import Costs
from supervisor.driver.straggler_swap import SwapJudge

FACTOR = 1.5


def straggler(own: float, peers: float, node: str = "n3") -> DetectionEvent:
    return DetectionEvent(STRAGGLER, (2,), (node,), "own_ewma_s", own, FACTOR * peers, 10.0,
                          (f"rank 2 on {node}: own time per step {own:.3g}s vs peers' median {peers:.3g}s",))  # fmt: skip


seconds = st.floats(0.001, 100.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(own=seconds, peers=seconds, period=st.one_of(st.none(), seconds), spares=st.integers(0, 3),
       restart=st.one_of(st.none(), st.floats(0, 3600)), stall=st.one_of(st.none(), st.floats(0, 600)),
       budget=st.one_of(st.none(), st.just("straggler happened 3 times without progress (budget: 2 restarts)")),
       horizon=st.floats(60, 86400))  # fmt: skip
def test_a_swap_only_with_a_spare_within_budget_and_when_keeping_costs_more(own, peers, period, spares, restart,
                                                                              stall, budget, horizon) -> None:  # fmt: skip
    costs = Costs(horizon_s=horizon)
    v = rule.judge(straggler(own, peers), factor=FACTOR, period_s=period, spares_free=spares, restart_s=restart,
                   stall_s=stall, over_budget=budget, costs=costs)  # fmt: skip
    assert 0.0 <= v.keep_cost_s <= horizon and math.isfinite(v.swap_cost_s)
    assert v.swap == (spares >= 1 and budget is None and v.keep_cost_s > v.swap_cost_s)
    assert v.swap_cost_s >= (restart if restart is not None else rule.RESTART_DEFAULT_S) + costs.spare_share * horizon
    if own <= peers:
        assert v.keep_cost_s < 1e-9 * horizon and not v.swap  # not slower (to rounding): nothing to gain
    assert v.why.startswith(f"kept, it costs ~{v.keep_cost_s:.0f}s")


@given(peers=seconds, a=st.floats(0, 10), b=st.floats(0, 10), period=seconds)
def test_the_cost_of_keeping_grows_with_the_excess(peers, a, b, period) -> None:
    lo, hi = sorted((a, b))
    assert rule.keep_cost_s(peers + lo, peers, period, 3600) <= rule.keep_cost_s(peers + hi, peers, period, 3600)


def test_the_figures_of_the_local_cluster_run() -> None:
    """What tests/integration/test_straggler_swap.py saw: 0.49 s own time vs 0.21 s, a 0.50 s step period, no
    restart measured yet: keeping costs ~2,000 s of the hour, a swap ~300 s (120 s restart + 5 % of the hour)."""
    v = rule.judge(straggler(0.489, 0.209), factor=FACTOR, period_s=0.503, spares_free=1, restart_s=None,
                   stall_s=None, over_budget=None)  # fmt: skip
    assert v.swap and round(v.keep_cost_s) == 2004 and v.swap_cost_s == 300.0
    slight = rule.judge(straggler(0.25, 0.209), factor=FACTOR, period_s=0.26, spares_free=1, restart_s=1500.0,
                        stall_s=60.0, over_budget=None)  # a slow restart (a big model): keep, alert and strike
    assert not slight.swap and slight.why.endswith("kept")
    for other in (DetectionEvent(LOSS_SPIKE, (0,), ("n1",), "loss", 9.0, 1.0), DetectionEvent(STRAGGLER)):
        assert not rule.judge(other, factor=FACTOR, period_s=None, spares_free=1, restart_s=None, stall_s=None,
                              over_budget=None).swap  # fmt: skip


def test_the_swap_checkpoints_stops_and_relaunches_without_the_node_and_is_not_a_fault() -> None:
    d = straggler(0.489, 0.209)
    v = rule.judge(d, factor=FACTOR, period_s=0.5, spares_free=1, restart_s=None, stall_s=None, over_budget=None)
    interruption, decision = rule.respond(d, v, policy.PolicyConfig(stop_grace_s=30.0))
    assert interruption.cls == ev.STRAGGLER and interruption.blamed_nodes == ("n3",)
    assert interruption.origin_ranks == (2,) and not interruption.beyond_the_program  # never drains for others
    assert [a.kind for a in decision.actions] == [policy.ALERT, policy.STOP_STEP, policy.RESTART_IN_ALLOCATION]
    alert, stop, relaunch = decision.actions
    assert alert.tier == "L3" and stop.params == {"checkpoint": True, "grace_s": 30.0}
    assert relaunch.params["exclude"] == ["n3"] and decision.state == "running"
    assert "swapped for a spare" in interruption.evidence[0]
    history = policy.History().record(ev.STRAGGLER, 100.0, ("n3",))
    assert history.faults_since_progress == 0 and history.fault_times == ()  # no backoff, no crash-loop count
    assert ev.STRAGGLER not in policy.FAULT_CLASSES


class Live:
    def __init__(self, *periods: float) -> None:
        self.ranks = [type("R", (), {"ewma_s": p})() for p in periods]


def test_the_driver_reads_the_budget_spares_and_restart_cost_from_the_campaign() -> None:
    state = CampaignState()
    spares = {"free": 1}
    judge = SwapJudge(state=state, policy_config=policy.PolicyConfig(), factor=FACTOR, costs=Costs(),
                      spares=lambda launched, now: spares["free"], clock=lambda: 1000.0)  # fmt: skip
    d = straggler(0.489, 0.209)
    assert judge.judge(DetectionEvent(LOSS_SPIKE, (0,), ("n1",)), Live(0.5), ("n1",)) is None
    assert judge.judge(d, Live(0.5, 0.5, 0.51), ("n1", "n2", "n3")).swap
    spares["free"] = 0
    assert "no spare node is free" in judge.judge(d, Live(0.5), ()).why
    spares["free"] = 1
    for t in (10.0, 20.0):  # two swaps since the last checkpoint: the budget (2) is spent
        state.apply(ev.interruption_event(t, ev.STRAGGLER, ("n3",), 0.9, ("swap",)))
    refused = judge.judge(d, Live(0.5), ())
    assert not refused.swap and "budget: 2" in refused.why
    state.apply({"v": 1, "t": 30.0, "type": ev.CHECKPOINT_COMMITTED, "step": 40, "path": "/c/step_40"})
    assert judge.judge(d, Live(0.5), ()).swap  # progress since: swaps again
    off = SwapJudge(state=CampaignState(), policy_config=policy.PolicyConfig(budgets={"straggler": 0}),
                    factor=FACTOR, costs=Costs(), spares=lambda launched, now: 1, clock=lambda: 1.0)  # fmt: skip
    assert "budget 0" in off.judge(d, Live(0.5), ()).why  # policy.budgets.straggler = 0: never swapped
