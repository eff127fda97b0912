"""Suspect-node ledger: decaying strikes folded from the journal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.detect import STRAGGLER, DetectionEvent
from supervisor.decisions.ledger import Ledger, LedgerConfig

H = 3600.0


def test_a_node_failure_excludes_the_node_for_one_half_life():
    ledger = Ledger.fold([ev.interruption_event(0.0, ev.NODE_FAILURE, ["node2"], 0.9, ["down"])], LedgerConfig(H))
    assert ledger.score("node2", 0.0) == 2.0
    assert ledger.excluded_nodes(H - 1) == {"node2"}
    assert ledger.excluded_nodes(H + 1) == frozenset()
    assert ledger.score("node2", 2 * H) == pytest.approx(0.5)


def test_one_hang_does_not_exclude_but_repeated_hangs_do():
    events = [ev.interruption_event(t, ev.HANG, ["node3"], 0.9, ["x"]) for t in (0.0, 60.0, 120.0)]
    ledger = Ledger.fold(events[:1], LedgerConfig(H))
    assert ledger.excluded_nodes(0.0) == frozenset()
    ledger = Ledger.fold(events, LedgerConfig(H))
    assert ledger.excluded_nodes(130.0) == {"node3"}


def test_preemption_and_unblamed_app_errors_never_strike():
    events = [
        ev.interruption_event(0.0, ev.PREEMPTION, ["node1"], 0.9, ["x"]),
        {"type": "interruption", "t": 0.0, "class": ev.APP_ERROR, "blamed_nodes": []},
    ]
    assert Ledger.fold(events).nodes == {}
    repeated = {"type": "interruption", "t": 0.0, "class": ev.APP_ERROR, "blamed_nodes": ["node1"]}
    assert Ledger.fold([repeated]).excluded_nodes(0.0) == {"node1"}  # it kept to node1: left out on requeue


def test_an_operator_forgives_and_later_strikes_count_again():
    events = [
        ev.interruption_event(0.0, ev.HARDWARE, ["node1"], 0.9, ["xid"]),
        ev.node_forgiven(10.0, "node1"),
    ]
    ledger = Ledger.fold(events, LedgerConfig(H))
    assert ledger.score("node1", 11.0) == 0.0 and ledger.excluded_nodes(11.0) == frozenset()
    ledger.apply(ev.interruption_event(20.0, ev.NODE_FAILURE, ["node1"], 0.9, ["down"]))
    assert ledger.excluded_nodes(21.0) == {"node1"}


def test_stragglers_strike_lightly_and_table_lists_worst_first():
    det = DetectionEvent(STRAGGLER, (5,), ("node4",))
    mark = ev.action_event(0.0, "mark_suspect", "L2", ["node4"], "straggler", {"strike": STRAGGLER})
    events = [ev.detection_event(det, 0.0), mark, ev.interruption_event(0.0, ev.NODE_FAILURE, ["node2"], 0.9, ["x"])]
    rows = Ledger.fold(events).table(0.0)
    assert [(r["node"], r["score"], r["excluded"]) for r in rows] == [("node2", 2.0, True), ("node4", 0.25, False)]


_strikes = st.lists(
    st.tuples(st.floats(0, 1e6), st.sampled_from(["node1", "node2"]), st.floats(0, 5)), max_size=30
)


@given(strikes=_strikes, a=st.floats(0, 2e6), gap=st.floats(0, 1e6))
def test_scores_decay_monotonically_between_strikes(strikes, a, gap):
    ledger = Ledger(LedgerConfig(H))
    for t, node, w in sorted(strikes):
        ledger.strike(node, w, t)
    last = max((t for t, _, _ in strikes), default=0.0)
    t1 = last + a
    for node in ("node1", "node2"):
        assert 0.0 <= ledger.score(node, t1 + gap) <= ledger.score(node, t1) + 1e-12


@given(strikes=_strikes)
def test_order_of_arrival_does_not_change_scores(strikes):
    ordered, shuffled = Ledger(LedgerConfig(H)), Ledger(LedgerConfig(H))
    for t, node, w in sorted(strikes):
        ordered.strike(node, w, t)
    for t, node, w in reversed(sorted(strikes)):
        shuffled.strike(node, w, t)
    now = 2e6
    for node in ("node1", "node2"):
        assert shuffled.score(node, now) == pytest.approx(ordered.score(node, now), rel=1e-9, abs=1e-12)


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="ledger.half_life_s"):
        LedgerConfig(half_life_s=0)
    with pytest.raises(ValueError, match="unknown key 'hangs'"):
        LedgerConfig(weights={"hangs": 1.0})


def test_ledger_config_from_mapping():
    config = LedgerConfig.from_mapping({"half_life_s": 60, "weights": {ev.HANG: 1.0}})
    assert config.half_life_s == 60 and config.weights[ev.HANG] == 1.0 and config.weights[ev.NODE_FAILURE] == 2.0
    with pytest.raises(ValueError, match="ledger.halflife: unknown setting"):
        LedgerConfig.from_mapping({"halflife": 1})


def test_hardware_strikes_never_fade_until_an_operator_forgives_the_node() -> None:
    """Time does not repair a GPU: a node blamed for a hardware fault stays out (issue 13: broken nodes came back
    after one half-life and failed again); a node failure still fades, and forgiving clears both."""
    week = 7 * 86400.0
    ledger = Ledger.fold([ev.interruption_event(0.0, ev.HARDWARE, ["n1"], 0.9, ["Xid 79"]),
                          ev.interruption_event(0.0, ev.NODE_FAILURE, ["n2"], 0.9, ["n2 DOWN"])])  # fmt: skip
    assert ledger.excluded_nodes(week) == {"n1"}
    assert ledger.score("n1", week) >= 2.0 > ledger.score("n2", week)
    ledger.apply(ev.node_forgiven(week, "n1"))
    assert ledger.excluded_nodes(week + 1) == frozenset()
    checked = Ledger.fold([ev.preflight(0.0, ["n3", "n4"], 30.0, ["n3"], blamed_nodes=["n3", "n4"])])
    assert checked.excluded_nodes(week) == {"n3"}  # unfit stays out; markedly slow fades
    fading = Ledger.fold([ev.interruption_event(0.0, ev.HARDWARE, ["n1"], 0.9, [])], LedgerConfig(sticky=()))
    assert fading.excluded_nodes(week) == frozenset()
    assert LedgerConfig.from_mapping({"sticky": ["hardware", "node_failure"]}).sticky == ("hardware", "node_failure")
    for bad in ({"sticky": ["nonsense"]}, {"sticky": "hardware"}):
        with pytest.raises(ValueError, match="ledger.sticky"):
            LedgerConfig.from_mapping(bad)


@given(
    strikes=st.lists(st.tuples(st.floats(0, 1e6), st.sampled_from(["n1", "n2", "n3"]), st.floats(0, 3),
                               st.sampled_from(["hardware", "hang", "node_failure"]), st.booleans()), max_size=30),
    now=st.floats(0, 3e6),
)  # fmt: skip
def test_excluded_nodes_is_exactly_the_nodes_scored_at_the_threshold(strikes, now):
    """excluded_nodes skips scoring nodes out for good (sticky strikes at the threshold, kept as strikes and
    forgiving happen, in any order): it must still be the plain definition."""
    ledger = Ledger(LedgerConfig(H))
    for t, node, w, reason, forgive in strikes:
        if forgive:
            ledger.forgive(node, t)
        else:
            ledger.strike(node, w, t, reason)
    expected = {n for n in ledger.nodes if ledger.score(n, now) >= ledger.config.threshold}
    assert ledger.excluded_nodes(now) == expected
