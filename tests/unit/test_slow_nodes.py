"""The preflight's rule for leaving a slow node out (decisions/slow_nodes.py): only a difference that persists over
3/4 of the rounds, beyond the factor and a floor, and that costs more than leaving the node out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.slow_nodes import COMPUTE, LATENCY, Costs, leave_out, slower_nodes

ROUNDS = 5


@st.composite
def noisy_fleet(draw):
    """Even nodes whose figures wander by up to 50 %, each with up to two rounds (a minority) of any spike."""
    metric = draw(st.sampled_from([COMPUTE, LATENCY]))
    base = 0.05 if metric == COMPUTE else 300e-6
    nodes = [f"n{i}" for i in range(draw(st.integers(3, 8)))]
    figures = {}
    for n in nodes:
        values = [base * (1 + draw(st.floats(0, 0.5))) for _ in range(ROUNDS)]
        for r in draw(st.sets(st.integers(0, ROUNDS - 1), max_size=(ROUNDS - 1) // 2)):
            values[r] = base * draw(st.floats(1, 1000))
        figures[n] = {metric: values}
    return figures


@given(figures=noisy_fleet(), spares=st.integers(0, 8))
def test_spikes_in_a_minority_of_rounds_never_leave_a_node_out(figures, spares):
    slower = slower_nodes(figures, factor=2.0)
    assert slower == []
    assert leave_out(slower, spares) == ({}, {})


@given(ratio=st.floats(2.5, 50), spares=st.integers(0, 3), nodes=st.integers(3, 8))
def test_a_node_slow_in_every_round_is_out_exactly_when_its_cost_beats_the_alternative(ratio, spares, nodes):
    figures = {f"n{i}": {COMPUTE: [0.05] * ROUNDS} for i in range(nodes)}
    figures["n0"] = {COMPUTE: [0.05 * ratio] * ROUNDS}
    costs = Costs()
    slower = slower_nodes(figures, factor=2.0, costs=costs)
    assert [(s.node, s.rounds, s.of) for s in slower] == [("n0", ROUNDS, ROUNDS)]
    out, kept = leave_out(slower, spares, costs)
    alternative = costs.spare_share * costs.horizon_s if spares else costs.requeue_cost_s
    assert ("n0" in out) == ((ratio - 1) * costs.horizon_s > alternative) and ("n0" in kept) != ("n0" in out)


def test_differences_under_the_floor_are_noise_whatever_the_ratio():
    figures = {f"n{i}": {LATENCY: [20e-6] * ROUNDS} for i in range(4)}
    figures["n3"] = {LATENCY: [150e-6] * ROUNDS}  # 7.5x, but 130 us more than its peers
    assert slower_nodes(figures, factor=2.0) == []
