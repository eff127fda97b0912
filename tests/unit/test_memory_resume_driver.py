"""The driver's memory-tier restore (driver/memory_resume.py) with a fake channel: it asks every usable node's
agent for its inventory, waits for the answers, journals the pure pick's choice (or why not), never resumes a
diverged launch's later snapshot, and leaves a pick that needs a copy between nodes to the filesystem tier."""

from __future__ import annotations

import json
from typing import Any

from supervisor.decisions.memory_pick import Held
from supervisor.driver.context import Context
from supervisor.driver.memory_resume import MemoryResume
from supervisor.heartbeat import wire
from supervisor.heartbeat.table import NodeView


class FakeChannel:
    """Agents that answer a report request at the next poll with what their node holds."""

    def __init__(self, holdings: dict[str, list[Held]], now: list[float]) -> None:
        self.holdings, self.now = holdings, now
        self.sent: list[tuple[str, int]] = []
        self.asked: set[str] = set()
        self.silent: set[str] = set()  # nodes whose agent stopped sending summaries (4 s ago)
        self.table = type("T", (), {"memory": {}, "replication": {}, "node_views": lambda _, nodes: {
            n: NodeView(n, 4.0 if n in self.silent else 0.2, 1, 1, 1, 0.0, "") for n in nodes}})()
        self.orders: list[tuple[str, dict[str, Any]]] = []
        self.copies_arrive = True

    def send_order(self, node: str, text: str) -> bool:
        """The source agent sends each shard to its rank's new node, which then holds (and reports) it."""
        doc = json.loads(text)
        self.orders.append((node, doc))
        if self.copies_arrive:
            for item in doc["fetch"]:
                copy = next(h for h in self.holdings[node] if (h.step, h.rank) == (item["step"], item["rank"]))
                self.holdings.setdefault(item["to"]["node"], []).append(copy)
                self.asked.add(item["to"]["node"])
        return True

    def send(self, node: str, cmds: list[wire.Command]) -> bool:
        self.sent += [(node, c.command) for c in cmds]
        self.asked.add(node)
        return True

    def poll(self, timeout: float) -> int:
        self.now[0] += timeout
        for node in self.asked:
            if node in self.holdings:
                self.table.memory[node] = (self.now[0], tuple(self.holdings[node]))
        self.asked = set()
        return 0


def both(step: int, launch: str = "7-0-1") -> dict[str, list[Held]]:
    return {"n1": [Held(step, 0, 2, "a", True, launch)], "n2": [Held(step, 1, 2, "b", True, launch)]}


def make(holdings: dict[str, list[Held]], enabled: bool = True) -> tuple[MemoryResume, FakeChannel, list[dict[str, Any]]]:
    now = [1000.0]
    events: list[dict[str, Any]] = []
    channel = FakeChannel(holdings, now)
    ctx = Context.of(events.append, clock=lambda: now[0])
    return MemoryResume(ctx, channel, enabled=enabled, wait_s=1.0, fetch_wait_s=1.0, wall=lambda: now[0]), channel, events


def test_a_relaunch_asks_every_node_and_resumes_from_the_newest_complete_snapshot() -> None:
    memory, channel, events = make(both(12))
    assert memory.pick(2, ("n1", "n2"), 1, ["n1", "n2"], 10) is None and channel.sent == []  # nobody reported any
    assert "no node reported a memory snapshot" in events.pop()["why"]
    channel.table.memory["n1"] = (0.0, tuple(both(3)["n1"]))  # an old report: the program takes snapshots
    assert memory.pick(1, ("n1", "n2"), 1, ["n1", "n2"], 10) is None and channel.sent == []  # nothing in memory yet
    chosen = memory.pick(2, ("n1", "n2"), 1, ["n1", "n2"], 10)
    assert chosen is not None and chosen.step == 12 and chosen.launch == "7-0-1"
    assert sorted(channel.sent) == [("n1", wire.CMD_REPORT_MEMORY), ("n2", wire.CMD_REPORT_MEMORY)]
    assert [(e["type"], e["launch"], e["step"], e["snapshot_launch"]) for e in events] == [
        ("memory_pick", 2, 12, "7-0-1")]


def test_a_shard_whose_rank_moves_is_copied_to_its_new_node_before_the_launch() -> None:
    """Rank 1 now runs on n3 (a spare): n2 (its old node, or the buddy holding its copy) is ordered to send it
    there; once n3 reports it, the snapshot is picked with every shard at home."""
    memory, channel, events = make(both(12))
    channel.table.memory["n1"] = (0.0, tuple(both(3)["n1"]))
    channel.table.replication.update({"n1": "127.0.0.1:1", "n2": "127.0.0.1:2", "n3": "127.0.0.1:3"})
    chosen = memory.pick(2, ("n1", "n3"), 1, ["n1", "n2", "n3"], 10)
    assert chosen is not None and chosen.step == 12 and chosen.sources == {0: "n1", 1: "n3"}
    assert channel.orders == [("n2", {"fetch": [{"to": {"node": "n3", "address": "127.0.0.1:3"}, "step": 12,
                                                 "rank": 1}]})]  # fmt: skip
    assert events[-1]["step"] == 12 and "copied from a buddy before the launch" in events[-1]["why"]
    assert events[-1]["fetches"] == 1, "journaled with the copies made for it"


def test_no_pick_when_a_moved_shard_cannot_be_copied_or_memory_is_off() -> None:
    memory, channel, events = make(both(12))
    channel.table.memory["n1"] = (0.0, tuple(both(3)["n1"]))
    assert memory.pick(2, ("n1", "n3"), 1, ["n1", "n2", "n3"], 10) is None  # n3's agent receives nothing
    assert events[-1]["step"] is None and "cannot receive shards: the filesystem tier" in events[-1]["why"]
    channel.table.replication.update({"n3": "127.0.0.1:3"})
    channel.copies_arrive = False
    assert memory.pick(2, ("n1", "n3"), 1, ["n1", "n2", "n3"], 10) is None
    assert "did not arrive within 1 s: the filesystem tier" in events[-1]["why"]
    off, channel, events = make(both(12), enabled=False)
    assert off.pick(2, ("n1", "n2"), 1, ["n1", "n2"], 10) is None and channel.sent == [] and events == []


def test_a_diverged_launchs_later_snapshots_are_never_picked() -> None:
    holdings = {n: both(9)[n] + both(12)[n] for n in ("n1", "n2")}
    memory, channel, events = make(holdings)
    channel.table.memory["n1"] = (0.0, tuple(both(3)["n1"]))
    memory.diverged_after("7-0-1", 10)  # a NaN/Inf loss after step 10 in that launch
    chosen = memory.pick(2, ("n1", "n2"), 1, ["n1", "n2"], None)
    assert chosen is not None and chosen.step == 9


def test_a_silent_agent_counts_with_what_it_said_last_or_nothing() -> None:
    memory, channel, events = make({"n1": both(12)["n1"]})  # n2's agent never answers
    channel.table.memory["n1"] = (0.0, tuple(both(3)["n1"]))
    assert memory.pick(2, ("n1", "n2"), 1, ["n1", "n2"], None) is None
    assert "1 of 2 ranks" in events[-1]["why"]


def test_a_node_that_does_not_answer_counts_with_its_last_report_only_while_its_agent_is_heard() -> None:
    """A busy agent that misses the report wait keeps its last inventory; a node whose agent went silent (lost at
    the same moment as another, not yet confirmed) offers nothing: its shard must not be picked to be read there."""
    holdings = both(12)
    memory, channel, _ = make(holdings)
    channel.table.memory["n2"] = (0.0, tuple(holdings.pop("n2")))  # n2 reported before, answers no more
    assert set(memory.holdings(["n1", "n2"])) == {"n1", "n2"}
    channel.silent.add("n2")
    assert set(memory.holdings(["n1", "n2"])) == {"n1"}
