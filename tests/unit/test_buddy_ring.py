"""The memory tier's buddy ring (decisions/buddy.py): every node copies to one other node and receives from
exactly one, and with a topology no node's buddy shares its switch whenever no switch holds more than half."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.buddy import ring

names = st.lists(st.from_regex(r"n[0-9]{1,3}", fullmatch=True), unique=True, max_size=40)


@given(names, st.data())
def test_every_node_has_one_other_buddy_and_one_ward(nodes: list[str], data: st.DataObject) -> None:
    switches = data.draw(st.none() | st.fixed_dictionaries({n: st.sampled_from("abcd") for n in nodes}))
    got = ring(nodes, switches)
    if len(nodes) < 2:
        assert got == {}
        return
    assert set(got) == set(nodes) and all(got[n] != n for n in nodes)
    assert sorted(got.values()) == sorted(nodes)  # each node holds exactly one other node's copies
    if switches is not None and max(Counter(switches.values()).values()) <= len(nodes) // 2:
        assert all(switches[n] != switches[got[n]] for n in nodes), (switches, got)


def test_without_a_topology_the_ring_follows_the_names() -> None:
    assert ring(["n3", "n1", "n2"]) == {"n1": "n2", "n2": "n3", "n3": "n1"}
    assert ring(["n1"]) == {}
