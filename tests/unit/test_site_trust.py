"""Who may take a node away from whom (supervisor/decisions/site_trust.py): a user's own verdicts apply at once,
another user's only on evidence read from the node or from Slurm, or through the lemon rule; printed text never
crosses users; an operator's forgiveness clears what came before it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.site_trust import SOURCES, SiteVerdict, excluded_for


def verdict(node: str, user: str, source: str, t: float = 100.0, klass: str = "hardware") -> SiteVerdict:
    return SiteVerdict(node=node, user=user, source=source, klass=klass, campaign=f"{user}-camp", t=t)


def test_a_users_own_verdict_keeps_their_next_campaign_off_the_node_whatever_its_source() -> None:
    got = excluded_for("alice", [verdict("n1", "alice", "program", klass="app_error")])
    assert [e.node for e in got] == ["n1"] and "your campaign alice-camp" in got[0].why


def test_another_users_printed_text_never_takes_a_node_away() -> None:
    assert excluded_for("bob", [verdict("n1", "alice", "program")]) == []


def test_node_and_slurm_evidence_cross_users() -> None:
    got = excluded_for("bob", [verdict("n1", "alice", "node"), verdict("n2", "carol", "slurm", klass="node_failure")])
    assert [(e.node, "another user's" in e.why) for e in got] == [("n1", True), ("n2", True)]
    assert "read from the node itself" in got[0].why and "Slurm controller" in got[1].why


def test_a_lemon_is_kept_from_everyone() -> None:
    got = excluded_for("bob", [verdict("n1", "alice", "program")], lemons=["n1"])
    assert [e.node for e in got] == ["n1"] and "lemon" in got[0].why


def test_forgiveness_clears_only_what_came_before_it() -> None:
    verdicts = [verdict("n1", "alice", "node", t=100.0), verdict("n2", "alice", "node", t=100.0),
                verdict("n2", "carol", "node", t=300.0)]  # fmt: skip
    got = excluded_for("bob", verdicts, forgiven_at={"n1": 200.0, "n2": 200.0})
    assert [e.node for e in got] == ["n2"]


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="verdict source must be one of"):
        verdict("n1", "alice", "rumour")


users = st.sampled_from(["alice", "bob", "carol"])
nodes = st.sampled_from(["n1", "n2", "n3", "n4"])
verdicts = st.lists(st.builds(verdict, nodes, users, st.sampled_from(SOURCES), st.floats(0, 1000)), max_size=20)


@given(users, verdicts, st.lists(nodes, max_size=2))
def test_nobody_loses_a_node_to_another_users_program_alone(user: str, held: list[SiteVerdict],
                                                           lemons: list[str]) -> None:  # fmt: skip
    got = {e.node for e in excluded_for(user, held, lemons=lemons)}
    for node in got:
        reasons = [v for v in held if v.node == node and (v.user == user or v.source != "program")]
        assert reasons or node in lemons
    for v in held:  # and every verdict that should count does
        if v.user == user or v.source != "program":
            assert v.node in got
