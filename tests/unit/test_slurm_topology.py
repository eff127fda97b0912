"""Slurm's switch topology for the memory tier's buddy ring: ``scontrol show topology`` parsed (topology/tree and
topology/block lines in the format Slurm's scontrol prints; no plugin: nothing), any text parsed or refused
with the parser's own error; the client's query; and the driver's ring, which puts nodes of different leaf
switches next to each other and falls back to name order when the query fails (journaled)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_backend import Replay, client, ok

from slurm.parse import ParseError
from slurm.parse_topology import parse_topology
from supervisor.driver.buddy_ring import BuddyRing
from supervisor.driver.context import Context

TREE = """SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[1-2]
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[3-4]
SwitchName=s2 Level=1 LinkSpeed=1 Nodes=node[1-4] Switches=s[0-1]
"""
BLOCK = "BlockName=b1 BlockIndex=0 Nodes=gpu[01-02] BlockSize=2\nBlockName=b2 BlockIndex=1 Nodes=gpu[03-04] BlockSize=2\n"


def test_each_node_gets_its_lowest_level_switch_or_its_block() -> None:
    assert parse_topology(TREE) == {"node1": "s0", "node2": "s0", "node3": "s1", "node4": "s1"}
    assert parse_topology(BLOCK) == {"gpu01": "b1", "gpu02": "b1", "gpu03": "b2", "gpu04": "b2"}
    assert parse_topology("") == {}  # no topology plugin (Slurm 22.05 prints nothing, exit 0)
    assert parse_topology("No topology information available\n") == {}


@pytest.mark.parametrize("bad", ["SwitchName= Level=0 Nodes=n1", "SwitchName=s0 Level=x Nodes=n1",
                                 "SwitchName=s0 Level=0 Nodes=n[1-"])  # fmt: skip
def test_a_malformed_line_is_refused_with_the_parsers_error(bad: str) -> None:
    with pytest.raises(ParseError):
        parse_topology(bad)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=60), st.builds(
    lambda n, lv, nodes: f"SwitchName={n} Level={lv} LinkSpeed=1 Nodes={nodes}",
    st.text(max_size=6), st.text(max_size=3), st.text(max_size=20))), max_size=6).map("\n".join))  # fmt: skip
def test_any_text_is_parsed_or_refused_with_the_parsers_error(text: str) -> None:
    try:
        got = parse_topology(text)
    except ParseError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in got.items())


def test_the_cli_client_asks_scontrol_show_topology() -> None:
    replay = Replay((["scontrol", "--local", "show", "topology"], ok(TREE)))
    assert client(replay).switches()["node3"] == "s1"
    assert replay.argvs == [["scontrol", "--local", "show", "topology"]]


class _Channel:
    def __init__(self, nodes: list[str]) -> None:
        self.table = type("T", (), {"replication": {n: f"127.0.0.1:{i + 1}" for i, n in enumerate(nodes)}})()
        self.orders: list[tuple[str, str]] = []

    def send_order(self, node: str, text: str) -> bool:
        self.orders.append((node, text))
        return True


def test_the_ring_puts_nodes_of_different_switches_next_to_each_other() -> None:
    events: list[dict[str, Any]] = []
    nodes = ["node1", "node2", "node3", "node4"]
    ring = BuddyRing(Context.of(events.append), _Channel(nodes), lambda: (), enabled=True,
                     switches=lambda: parse_topology(TREE))  # fmt: skip
    ring.observe()
    got = events[-1]["ring"]
    switch = parse_topology(TREE)
    assert all(switch[n] != switch[got[n]] for n in nodes), got


def test_a_failed_topology_query_is_journaled_and_the_ring_follows_the_names() -> None:
    events: list[dict[str, Any]] = []

    def broken() -> dict[str, str]:
        raise RuntimeError("slurmctld away")

    ring = BuddyRing(Context.of(events.append), _Channel(["node1", "node2", "node3"]), lambda: (), enabled=True,
                     switches=broken)  # fmt: skip
    ring.observe()
    assert [e["type"] for e in events] == ["supervisor_error", "memory_buddies"]
    assert events[-1]["ring"] == {"node1": "node2", "node2": "node3", "node3": "node1"}
