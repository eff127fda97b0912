"""The memory tier's flush to the filesystem before the job stops (issue 27): the agents' copies
(``agent.flush_copy``), the commit and the read of a flushed snapshot (``checkpoint.flushed``), the driver that
orders and commits it (``driver.memory_flush``), and the requeued job's pick from it (``driver.memory_resume``).
Real files in a temporary directory; the agents are in-process (their ``Flusher`` runs the order the fake channel
carries)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent.flush_copy import Flusher, copy_shard
from supervisor.checkpoint import flushed
from supervisor.decisions.memory_pick import Held, pick
from supervisor.driver.context import Context
from supervisor.driver.memory_flush import MemoryFlush
from supervisor.driver.memory_resume import FLUSHED, MemoryResume
from supervisor.heartbeat.memory_report import DIGEST_CHARS
from supervisor.heartbeat.orders import FlushShard, OrderError, flush_order, parse_orders

KEY = hashlib.sha256(b"campaign").digest()


def put_shard(store: Path, step: int, rank: int, launch: str, data: bytes | None = None) -> Held:
    """A shard in a node store as the rank leaves it: bytes, then the record (size, SHA-256, launch)."""
    data = data if data is not None else os.urandom(1000 + rank)
    folder = store / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.snap").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step, "rank": rank, "world": 2, "size": len(data),
                                                          "sha256": digest, "launch": launch}))  # fmt: skip
    return Held(step, rank, 2, digest[:DIGEST_CHARS], True, launch)  # as the agents report it: a prefix


class AgentsChannel:
    """Two nodes' agents: the inventories the supervisor asks for, and flush orders carried out at once."""

    def __init__(self, stores: dict[str, Path], held: dict[str, list[Held]], now: list[float]) -> None:
        self.stores, self.held, self.now = stores, held, now
        self.table = type("T", (), {"memory": {n: (0.0, tuple(h)) for n, h in held.items()}, "replication": {},
                                    "node_views": lambda _, nodes: {}})()  # fmt: skip
        self.orders: list[tuple[str, dict[str, Any]]] = []
        self.obey = True

    def send(self, node: str, cmds: list[Any]) -> bool:
        return True

    def send_order(self, node: str, text: str) -> bool:
        self.orders.append((node, json.loads(text)))
        order = parse_orders(text).flush
        if self.obey and order is not None:
            Flusher(self.stores[node]).run(order)
        return True

    def poll(self, timeout: float) -> int:
        self.now[0] += timeout
        for node, held in self.held.items():
            self.table.memory[node] = (self.now[0], tuple(held))
        return 0


def two_nodes(tmp_path: Path, step: int = 12, launch: str = "7-0-1") -> tuple[dict[str, Path], dict[str, list[Held]]]:
    stores = {"n1": tmp_path / "n1", "n2": tmp_path / "n2"}
    held = {"n1": [put_shard(stores["n1"], step, 0, launch)], "n2": [put_shard(stores["n2"], step, 1, launch)]}
    return stores, held


def make(tmp_path: Path, stores: dict[str, Path], held: dict[str, list[Held]]):
    now = [1000.0]
    events: list[dict[str, Any]] = []
    ctx = Context.of(events.append, clock=lambda: now[0])
    channel = AgentsChannel(stores, held, now)
    campaign = tmp_path / "campaign"
    campaign.mkdir(exist_ok=True)
    resume = MemoryResume(ctx, channel, enabled=True, wait_s=0.3, fetch_wait_s=0.3, wall=lambda: now[0],
                          flushed=lambda: flushed.newest(campaign, KEY))  # fmt: skip
    return MemoryFlush(ctx, channel, resume, campaign, KEY, enabled=True), resume, channel, events, campaign


def test_flush_orders_parse_strictly() -> None:
    text = flush_order("/c/memory-flush/.step_3-ab.partial", [(3, 0, "j-0-1"), (3, 1, "j-0-1")])
    got = parse_orders(text).flush
    assert got is not None and got.directory == "/c/memory-flush/.step_3-ab.partial"
    assert got.shards == (FlushShard(3, 0, "j-0-1"), FlushShard(3, 1, "j-0-1")) and not got.background
    persist = parse_orders(flush_order("/c/memory-flush/.step_3-ab.partial", [(3, 0, "j-0-1")], background=True))
    assert persist.flush is not None and persist.flush.background
    for bad in ({"dir": "/a", "shards": [{"step": 1, "rank": 0, "launch": ""}], "background": 1},
                {"dir": "/a", "shards": [{"step": 1, "rank": 0, "launch": ""}], "background": "yes"},
                {"dir": "relative/x", "shards": [{"step": 1, "rank": 0, "launch": ""}]},
                {"dir": "/a/../etc", "shards": [{"step": 1, "rank": 0, "launch": ""}]},
                {"dir": "/a", "shards": []},
                {"dir": "/a", "shards": [{"step": -1, "rank": 0, "launch": ""}]},
                {"dir": "/a", "shards": [{"step": 1, "rank": 0}]},
                {"dir": "/a", "shards": [{"step": 1, "rank": 0, "launch": "x" * 65}]},
                {"dir": "/a", "shards": [], "more": 1}):  # fmt: skip
        with pytest.raises(OrderError):
            parse_orders(json.dumps({"flush": bad}))


def test_an_agent_copies_only_the_named_launchs_shard_and_never_a_torn_copy(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    put_shard(store, 5, 0, "j-0-1", b"old launch")
    assert copy_shard(store, out, FlushShard(5, 0, "j-0-2")) == "missing"  # step 5 again, by another launch
    replica = store / "replica" / "n9"
    put_shard(replica, 5, 0, "j-0-2", b"the buddy's copy")
    assert copy_shard(store, out, FlushShard(5, 0, "j-0-2")) == "copied"
    assert (out / "rank_0.snap").read_bytes() == b"the buddy's copy"
    assert json.loads((out / "rank_0.json").read_text())["launch"] == "j-0-2"
    (store / "step_5" / "rank_0.snap").write_bytes(b"flipped!!!")  # the bytes no longer match their record
    (out / "rank_0.snap").unlink()
    (out / "rank_0.json").unlink()
    assert copy_shard(store, out, FlushShard(5, 0, "j-0-1")) == "digest"
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_stopping_job_flushes_its_newest_snapshot_and_the_requeued_job_resumes_from_it(tmp_path: Path) -> None:
    stores, held = two_nodes(tmp_path)
    flush, _, channel, events, campaign = make(tmp_path, stores, held)
    pending = flush.start(("n1", "n2"), 1, ["n1", "n2"], 10)
    assert pending is not None and sorted(node for node, _ in channel.orders) == ["n1", "n2"]
    path = flush.finish(pending, 10, deadline=0.0)  # the ranks' own save did not come (still step 10)
    assert path == campaign / "memory-flush" / "step_12"
    assert events[-1]["type"] == "memory_flush" and events[-1]["step"] == 12 and events[-1]["shards"] == 2
    assert sorted(p.name for p in (campaign / "memory-flush").iterdir()) == ["step_12"]  # no staging left
    # The requeued job: a new supervisor, node memory empty; its first launch reads the flushed copy.
    fresh = {"n3": tmp_path / "n3", "n4": tmp_path / "n4"}
    _, resume, channel, events, _ = make(tmp_path, fresh, {})
    chosen = resume.pick(1, ("n3", "n4"), 1, ["n3", "n4"], 10)
    assert chosen is not None and chosen.step == 12 and chosen.launch == "7-0-1" and chosen.fetches == 0
    assert set(chosen.sources.values()) == {FLUSHED} and resume.flushed_dir(chosen) == str(path)
    assert "2 shard(s) read from the flushed copy" in events[-1]["why"]
    # ... but never when the filesystem checkpoint is as new, nor once the flush was altered.
    assert resume.pick(1, ("n3", "n4"), 1, ["n3", "n4"], 12) is None
    manifest = json.loads((path / "snapshot.json").read_text())
    manifest["step"] = 13
    (path / "snapshot.json").write_text(json.dumps(manifest))
    assert flushed.newest(campaign, KEY)[0] is None and resume.pick(1, ("n3", "n4"), 1, ["n3", "n4"], 10) is None


def test_a_flush_is_dropped_when_the_ranks_saved_as_new_or_a_shard_never_arrives(tmp_path: Path) -> None:
    stores, held = two_nodes(tmp_path)
    flush, _, channel, events, campaign = make(tmp_path, stores, held)
    pending = flush.start(("n1", "n2"), 1, ["n1", "n2"], 10)
    assert flush.finish(pending, 12, deadline=0.0) is None  # the ranks committed step 12 themselves
    assert "committed step 12 themselves" in events[-1]["why"] and events[-1]["step"] is None
    channel.obey = False  # the agents are gone (killed with the job)
    pending = flush.start(("n1", "n2"), 1, ["n1", "n2"], 10)
    assert flush.finish(pending, 10, deadline=0.0) is None
    assert "2 shard(s) of step 12 did not reach the filesystem" in events[-1]["why"]
    assert [p.name for p in (campaign / "memory-flush").iterdir()] == []
    assert flush.start(("n1", "n2"), 1, ["n1", "n2"], 12) is None  # nothing newer than the filesystem's
    assert events[-1]["step"] is None and events[-1]["why"].startswith("nothing to flush")


def test_a_torn_or_missing_flushed_shard_is_not_offered(tmp_path: Path) -> None:
    stores, held = two_nodes(tmp_path)
    flush, _, _, _, campaign = make(tmp_path, stores, held)
    path = flush.finish(flush.start(("n1", "n2"), 1, ["n1", "n2"], None), None, deadline=0.0)
    assert path is not None and flushed.newest(campaign, KEY)[0] is not None
    with open(path / "rank_1.snap", "ab") as f:
        f.write(b"x")  # its size no longer matches
    found, why = flushed.newest(campaign, KEY)
    assert found is None and "1 rank shard(s) missing or altered" in why
    assert flushed.newest(campaign, hashlib.sha256(b"another campaign").digest())[0] is None


def test_the_pick_prefers_node_memory_to_the_flushed_copy_and_counts_no_fetch_for_it() -> None:
    a, b = Held(9, 0, 2, "a", True, "L"), Held(9, 1, 2, "b", True, "L")
    held = {"n1": [a], FLUSHED: [a, b], "n2": [b]}
    chosen, _ = pick(held, world=2, usable=["n1", "n2", FLUSHED], placement={0: "n1", 1: "n3"},
                     newest_filesystem_step=None, shared=frozenset({FLUSHED}))  # fmt: skip
    assert chosen is not None and chosen.sources == {0: "n1", 1: "n2"} and chosen.fetches == 1
    chosen, _ = pick({"n1": [a], FLUSHED: [a, b]}, world=2, usable=["n1", FLUSHED], placement={0: "n1", 1: "n3"},
                     newest_filesystem_step=None, shared=frozenset({FLUSHED}))  # fmt: skip
    assert chosen is not None and chosen.sources == {0: "n1", 1: FLUSHED} and chosen.fetches == 0


def test_a_requeue_after_a_node_loss_flushes_the_lost_nodes_shard_from_its_buddy(tmp_path: Path) -> None:
    """The lost node's agent is gone (its last report still in the table): the flush asks only the nodes left
    (``usable``, as the FLUSH_MEMORY action's exclude leaves them), the buddy's replica stands in for it."""
    stores, held = two_nodes(tmp_path)
    data = (stores["n2"] / "step_12" / "rank_1.snap").read_bytes()
    held["n1"].append(put_shard(stores["n1"] / "replica" / "n2", 12, 1, "7-0-1", data))
    flush, _, channel, events, campaign = make(tmp_path, stores, held)
    pending = flush.start(("n1", "n2"), 1, ["n1"], 10)
    assert pending is not None and [node for node, _ in channel.orders] == ["n1"]
    path = flush.finish(pending, 10, deadline=0.0)
    assert path == campaign / "memory-flush" / "step_12" and events[-1]["shards"] == 2
    assert (path / "rank_1.snap").read_bytes() == data
