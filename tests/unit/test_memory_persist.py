"""Persisting memory snapshots while the training runs (issue 27): the rule (``decisions.memory_persist``), the
agents' choice of one step among snapshots the ranks keep replacing (``agent.flush_copy.pin_next``), and the
driver that orders, commits and journals it (``driver.memory_persist``). Real files; the agents' ``Flusher``
runs in-process on its own thread, as in the agent; the ranks are a thread writing snapshots and deleting all
but their newest two, as ``checkpoint.memory`` does."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.agent.flush_copy import Flusher, pin_next
from supervisor.checkpoint import flushed
from supervisor.decisions import memory_persist as rule
from supervisor.decisions.memory_pick import Held
from supervisor.driver.context import Context
from supervisor.driver.memory_persist import MemoryPersist
from supervisor.driver.memory_resume import FLUSHED, MemoryResume
from supervisor.heartbeat.memory_report import DIGEST_CHARS
from supervisor.heartbeat.orders import FlushShard, parse_orders

KEY = hashlib.sha256(b"campaign").digest()
TAG = "7-0-1"


def test_the_setting_is_auto_off_or_seconds_in_bounds() -> None:
    assert rule.parse_setting("auto") == "auto" and rule.parse_setting("off") == "off"
    assert rule.parse_setting(120) == 120.0
    for bad in (0, -5, 86_401, "often", True, None, float("nan")):
        with pytest.raises(rule.PersistSettingError):
            rule.parse_setting(bad)


def test_auto_persists_every_minute_or_less_often_when_a_copy_is_slow() -> None:
    assert rule.every_s("auto", None) == rule.AUTO_MIN_S
    assert rule.every_s("auto", 30.0) == 300.0  # the copies take at most 10 % of the time
    assert rule.every_s(15.0, 30.0) == 15.0 and rule.every_s("off", 1.0) is None


@given(every=st.none() | st.floats(1, 1e5), since=st.none() | st.floats(0, 1e6),
       newest=st.none() | st.integers(0, 10**6), persisted=st.none() | st.integers(0, 10**6))  # fmt: skip
def test_a_persist_is_due_only_for_a_newer_snapshot_once_the_interval_passed(every, since, newest, persisted) -> None:
    got = rule.due(every, since, newest, persisted)
    newer = newest is not None and (persisted is None or newest > persisted)
    assert got == (every is not None and newer and (since is None or since >= every))


class Ranks:
    """Ranks on one node writing a snapshot every ``period_s`` and keeping their newest two (the store's rule)."""

    def __init__(self, store: Path, ranks: list[int], period_s: float = 0.005, world: int = 2) -> None:
        self.store, self.ranks, self.period_s, self.world = store, ranks, period_s, world
        self.step, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def write(self, step: int) -> None:
        folder = self.store / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        for rank in self.ranks:
            data = f"state of rank {rank} at step {step}".encode() * 50
            (folder / f"rank_{rank}.snap").write_bytes(data)
            (folder / f"rank_{rank}.json").write_text(json.dumps({
                "step": step, "rank": rank, "world": self.world, "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "launch": TAG}))  # fmt: skip
        for old in self.store.glob("step_*"):
            if int(old.name[5:]) < step - 1:
                shutil.rmtree(old, ignore_errors=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.step += 1
            self.write(self.step)
            time.sleep(self.period_s)

    def held(self) -> list[Held]:
        """The inventory as the agent last reported it (the newest step it saw)."""
        step = self.step
        return [Held(step, r, self.world, "0" * DIGEST_CHARS, True, TAG) for r in self.ranks]


def test_the_agent_copies_one_same_step_for_all_its_ranks_while_they_replace_their_snapshots(tmp_path: Path) -> None:
    """The step the supervisor saw is long gone when the order arrives: the agent takes the first snapshot at or
    after it, the same step for every rank, and holds it open while the ranks delete it."""
    ranks = Ranks(tmp_path / "store", [0, 1], period_s=0.002)
    ranks.thread.start()
    try:
        time.sleep(0.05)
        opened = pin_next(ranks.store, (FlushShard(1, 0, TAG), FlushShard(1, 1, TAG)), time.monotonic() + 5)
        assert len(opened) == 2
        steps = {record["step"] for _, record, _ in opened}
        time.sleep(0.05)  # the ranks delete those steps meanwhile: the open files still read whole
        for src, record, rank in opened:
            with src:
                assert hashlib.sha256(src.read()).hexdigest() == record["sha256"] and record["rank"] == rank
        assert len(steps) == 1
    finally:
        ranks.stop.set()
        ranks.thread.join(5)
    assert pin_next(ranks.store, (FlushShard(10**9, 0, TAG),), time.monotonic() + 0.1) == []  # never written


class Channel:
    """The supervisor's side: the agents' inventories, and orders carried out by each node's real Flusher."""

    def __init__(self, nodes: dict[str, Ranks]) -> None:
        self.nodes = nodes
        self.flushers = {n: Flusher(r.store) for n, r in nodes.items()}
        self.table = SimpleNamespace(memory={}, replication={})
        self.orders: list[tuple[str, dict[str, Any]]] = []

    def refresh(self) -> None:
        for node, ranks in self.nodes.items():
            self.table.memory[node] = (time.time(), tuple(ranks.held()))

    def send_order(self, node: str, text: str) -> bool:
        self.orders.append((node, json.loads(text)))
        order = parse_orders(text).flush
        assert order is not None
        self.flushers[node].order(order)
        return True


def live(world: int = 2) -> SimpleNamespace:
    return SimpleNamespace(ranks=[SimpleNamespace(rank=r, node=f"n{r + 1}") for r in range(world)])


def make(tmp_path: Path, channel: Channel, setting: str | float = 0.2, fs_step: int | None = None):
    events: list[dict[str, Any]] = []
    ctx = Context.of(events.append, clock=time.time)
    campaign = tmp_path / "campaign"
    campaign.mkdir(exist_ok=True)
    resume = MemoryResume(ctx, channel, enabled=True, flushed=lambda: flushed.newest(campaign, KEY))
    persist = MemoryPersist(ctx, channel, resume, campaign, KEY, setting=setting,
                            newest_filesystem_step=lambda: fs_step, launch_tag=lambda: TAG, enabled=True)  # fmt: skip
    return persist, resume, events, campaign


def watch(persist: MemoryPersist, channel: Channel, until: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        channel.refresh()
        persist.observe(live())
        time.sleep(0.02)


def lockstep(nodes: dict[str, Ranks], stop: threading.Event, period_s: float = 0.005) -> threading.Thread:
    """The nodes' ranks writing the same steps together, as ranks in one collective training do."""

    def run() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            for ranks in nodes.values():
                ranks.step = step
                ranks.write(step)
            time.sleep(period_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_running_training_is_persisted_periodically_and_a_relaunch_resumes_from_it(tmp_path: Path) -> None:
    nodes = {"n1": Ranks(tmp_path / "n1", [0]), "n2": Ranks(tmp_path / "n2", [1])}
    channel = Channel(nodes)
    persist, _, events, campaign = make(tmp_path, channel, setting=0.2)
    stop = threading.Event()
    writer = lockstep(nodes, stop)
    try:
        time.sleep(0.05)
        watch(persist, channel, lambda: sum(e["step"] is not None for e in events) >= 2)
    finally:
        stop.set()
        writer.join(5)
    # On a busy machine an agent may look only after the fake ranks (a snapshot every 5 ms) replaced the step
    # twice: that persist is dropped, journaled, and the next starts at once; the committed ones move on.
    done = [e for e in events if e["type"] == "memory_persist" and e["step"] is not None]
    failed = [e for e in events if e["type"] == "memory_persist" and e["step"] is None]
    assert all("different steps" in e["why"] for e in failed), failed
    assert len(done) >= 2 and done[1]["step"] > done[0]["step"] and done[0]["shards"] == 2
    orders = [doc["flush"] for _, doc in channel.orders]
    assert all(o["background"] for o in orders) and {n for n, _ in channel.orders} == {"n1", "n2"}
    newest, why = flushed.newest(campaign, KEY)
    assert newest is not None and newest.step == done[-1]["step"], why  # only the newest persist is kept
    assert [p.name for p in (campaign / "memory-flush").iterdir()] == [f"step_{newest.step}"]
    # A relaunch on other nodes (memory lost with the job) resumes from it, not from the older checkpoint.
    _, resume, picks, _ = make(tmp_path, Channel({}))
    chosen = resume.pick(1, ("n3", "n4"), 1, ["n3", "n4"], 0)
    assert chosen is not None and chosen.step == newest.step and set(chosen.sources.values()) == {FLUSHED}


def two_nodes_at(tmp_path: Path, step: int) -> tuple[dict[str, Ranks], Channel]:
    """Two nodes, a rank each, whose last snapshot is of ``step`` (the ranks write no more unless started)."""
    nodes = {"n1": Ranks(tmp_path / "n1", [0]), "n2": Ranks(tmp_path / "n2", [1])}
    for ranks in nodes.values():
        ranks.step = step
        ranks.write(step)
    return nodes, Channel(nodes)


def test_nothing_is_persisted_that_the_filesystem_already_has_and_a_silent_node_fails_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A snapshot no newer than the program's checkpoint is not copied; a node whose agent never copies (its
    ranks stopped snapshotting) ends the persist after the wait, journaled once, nothing committed."""
    frozen, channel = two_nodes_at(tmp_path, 5)
    persist, _, events, campaign = make(tmp_path, channel, fs_step=5)
    watch(persist, channel, lambda: False, timeout=0.3)
    assert channel.orders == [] and events == []
    persist, _, events, campaign = make(tmp_path, channel, fs_step=4)
    frozen["n1"].thread.start()  # rank 0 snapshots on; rank 1 (n2) wrote its last at step 5
    monkeypatch.setattr("supervisor.driver.memory_persist.PERSIST_WAIT_S", 0.2)
    monkeypatch.setattr("supervisor.driver.memory_persist.COPY_ALLOWANCE_S", 0.1)
    monkeypatch.setattr("supervisor.agent.flush_copy.PERSIST_WAIT_S", 0.2)
    persist.setting = 0.05
    try:
        watch(persist, channel, lambda: len(channel.orders) >= 6, timeout=10)
    finally:
        frozen["n1"].stop.set()
        frozen["n1"].thread.join(5)
    failed = [e for e in events if e["type"] == "memory_persist"]
    assert len(failed) == 1 and failed[0]["step"] is None and "ranks [1]" in failed[0]["why"], failed
    assert flushed.newest(campaign, KEY)[0] is None


def test_a_stops_flush_drops_the_persist_under_way(tmp_path: Path) -> None:
    nodes, channel = two_nodes_at(tmp_path, 3)
    for flusher in channel.flushers.values():  # the agents have not copied yet
        flusher.order = lambda flush: None  # type: ignore[method-assign]
    persist, _, events, campaign = make(tmp_path, channel, setting=0.01)
    channel.refresh()
    persist.observe(live())
    assert persist.pending is None, "the interval counts from the first snapshot seen"
    time.sleep(0.02)
    persist.observe(live())
    assert persist.pending is not None
    staging = persist.pending.staging
    staging.mkdir()
    persist.cancel()
    assert persist.pending is None and not staging.exists() and events == []
    # ... as does a relaunch: a persist of the launch before it (a node of it lost) is not waited for.
    time.sleep(0.02)
    persist.observe(live())
    assert persist.pending is not None and persist.pending.launch == TAG
    staging = persist.pending.staging
    persist.launch_tag = lambda: "7-0-2"
    persist.observe(live())
    assert persist.pending is None and not staging.exists() and events == []


def test_nodes_that_took_different_steps_retry_once_at_once_then_wait_for_the_interval(tmp_path: Path) -> None:
    """A mismatch is a race with the ranks' deletions, not a fault of the snapshots: one more try at once; a
    second in a row waits for the interval (each try copies the whole state to the shared filesystem)."""
    nodes, channel = two_nodes_at(tmp_path, 3)
    persist, _, events, campaign = make(tmp_path, channel, setting=3600.0)
    persist.last_started = time.monotonic() - 7200.0  # the interval has passed

    def mismatch() -> None:
        assert persist.pending is not None
        persist.pending.staging.mkdir(exist_ok=True)
        for rank, step in ((0, 4), (1, 5)):
            data = b"x" * 10
            (persist.pending.staging / f"rank_{rank}.snap").write_bytes(data)
            (persist.pending.staging / f"rank_{rank}.json").write_text(json.dumps({
                "step": step, "rank": rank, "world": 2, "size": 10, "sha256": hashlib.sha256(data).hexdigest(),
                "launch": TAG}))  # fmt: skip

    for flusher in channel.flushers.values():
        flusher.order = lambda flush: None  # type: ignore[method-assign]
    channel.refresh()
    persist.observe(live())
    mismatch()
    persist.observe(live())  # the miss: dropped
    assert persist.pending is None and persist.again
    persist.observe(live())  # ... and tried again at once
    assert persist.pending is not None
    mismatch()
    persist.observe(live())
    persist.observe(live())  # a second miss in a row: the interval first
    assert persist.pending is None and not persist.again
    assert [e["step"] for e in events] == [None], events  # journaled once


def test_a_campaign_directory_that_cannot_be_written_is_journaled_and_the_watch_goes_on(tmp_path: Path) -> None:
    """``memory-flush/`` cannot be made (the campaign directory is a file here): the pass journals the error
    and returns; nothing raises into the watch, whose detectors run after the observers."""
    nodes, channel = two_nodes_at(tmp_path, 3)
    persist, _, events, campaign = make(tmp_path, channel, setting=3600.0)
    campaign.rmdir()
    campaign.write_text("not a directory")
    persist.last_started = time.monotonic() - 7200.0
    channel.refresh()
    persist.observe(live())  # must not raise
    assert persist.pending is None and channel.orders == []
    assert [e["type"] for e in events] == ["supervisor_error"], events
