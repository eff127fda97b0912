"""Aggregator table math (ages, rates, staleness) and the live.json it writes."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from supervisor.heartbeat import wire
from supervisor.heartbeat.live import live_document
from supervisor.heartbeat.server import AggregatorServer
from supervisor.heartbeat.table import LiveTable

KEY = wire.derive_key(b"s" * 32)
WALL = 1_700_000_000 * 10**9
S = 10**9


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> int:
        return WALL + int(self.t * 1e9)


def entry(rank: int, step: int, *, pid: int = 500, age_ms: int = 100, cpu: float = 0.0,
          state: int = wire.ST_RUNNING, ewma: float = 0.5, loss: float = 1.0) -> wire.RankEntry:
    return wire.RankEntry(rank, pid, step, 1, state, 0, 0, age_ms, ewma, 0.4, 0.6, loss, step, step, -1, 0, cpu)


def frame(seq: int, mono_s: float, ranks: list[wire.RankEntry], node: str = "n1", clock: Clock | None = None) -> bytes:
    wall = clock.wall() if clock else WALL
    return wire.encode_summary(KEY, instance=1, seq=seq, wall_ns=wall, mono_ns=int(mono_s * S), job="9", node=node,
                               ranks=ranks)


def table(clock: Clock, window: float = 3.0) -> LiveTable:
    return LiveTable(KEY, "9", rate_window_s=window, mono=clock.mono, wall_ns=clock.wall)


def test_beat_age_is_the_agents_age_plus_our_time_since_receipt() -> None:
    c = Clock()
    t = table(c)
    # The agent's monotonic clock is wildly different from ours: it must not matter.
    assert t.feed(frame(1, 9_999_999.0, [entry(0, 10, age_ms=250)], clock=c))
    c.t += 2.0
    (r,) = t.rank_views()
    assert r.beat_age_s == pytest.approx(2.25)
    assert t.node_views()["n1"].staleness_s == pytest.approx(2.0)


def test_rates_come_from_steps_over_agent_time_and_fall_to_zero_when_steps_stop() -> None:
    c = Clock()
    t = table(c, window=3.0)
    for i in range(8):  # 4 steps/s for 8 seconds, agent time starts at 50 s
        t.feed(frame(i + 1, 50.0 + i, [entry(0, 4 * i, cpu=0.5 * i)], clock=c))
        c.t += 1.0
    (r,) = t.rank_views()
    assert r.steps_per_s == pytest.approx(4.0)
    assert r.cpu_frac == pytest.approx(0.5)
    assert r.ewma_steps_per_s == pytest.approx(2.0)
    for i in range(8, 16):  # now stuck at step 28
        t.feed(frame(i + 1, 50.0 + i, [entry(0, 28, cpu=3.5)], clock=c))
    (r,) = t.rank_views()
    assert r.steps_per_s == 0.0 and r.cpu_frac == 0.0


def test_no_rate_until_two_frames_a_window_apart_and_none_across_a_rank_restart() -> None:
    c = Clock()
    t = table(c, window=3.0)
    t.feed(frame(1, 0.0, [entry(0, 0)], clock=c))
    t.feed(frame(2, 1.0, [entry(0, 5)], clock=c))
    assert t.rank_views()[0].steps_per_s is None
    t.feed(frame(3, 3.0, [entry(0, 15)], clock=c))
    t.feed(frame(4, 4.0, [entry(0, 20)], clock=c))
    assert t.rank_views()[0].steps_per_s == pytest.approx(5.0)
    t.feed(frame(5, 5.0, [entry(0, 2, pid=777)], clock=c))  # restarted from an older checkpoint: new pid
    assert t.rank_views()[0].steps_per_s is None


def test_unknown_exit_code_and_never_beaten_are_none() -> None:
    c = Clock()
    t = table(c)
    t.feed(frame(1, 0.0, [entry(0, 0, age_ms=wire.NO_BEAT, state=wire.ST_GONE)], clock=c))
    (r,) = t.rank_views()
    assert r.beat_age_s is None and r.exit_code is None and r.state == "gone"


def test_live_document_is_json_safe_and_keeps_the_worst_ranks_when_capped() -> None:
    c = Clock()
    t = table(c)
    ranks = [entry(r, 10, age_ms=100 + r) for r in range(16)]
    ranks[3] = entry(3, 10, state=wire.ST_STOPPED, loss=float("nan"))
    t.feed(frame(1, 0.0, ranks[:8], node="n1", clock=c))
    t.feed(frame(1, 0.0, ranks[8:], node="n2", clock=c))
    doc = live_document(t.snapshot(), max_rank_rows=2)
    json.dumps(doc, allow_nan=False)
    assert doc["ranks_total"] == 16
    assert [r["rank"] for r in doc["ranks"]] == [3, 15]  # stopped first, then the oldest beat
    assert doc["ranks"][0]["loss"] == "nan" and doc["ranks"][0]["state"] == "stopped"
    assert [n["node"] for n in doc["nodes"]] == ["n1", "n2"]


def test_server_receives_over_udp_writes_private_live_json_and_reaches_the_agent(tmp_path: Path) -> None:
    campaign = tmp_path / "camp"
    server = AggregatorServer(campaign, "9", live_interval_s=0.0)
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    agent.settimeout(5)
    try:
        key = server.key
        raw = wire.encode_summary(key, instance=3, seq=1, wall_ns=time.time_ns(), mono_ns=1, job="9", node="nodeA",
                                  ranks=[entry(0, 1), entry(1, 1)])
        agent.sendto(raw, server.address)
        agent.sendto(b"junk", server.address)
        deadline = time.monotonic() + 5
        while server.table.counters["ok"] < 1 and time.monotonic() < deadline:
            server.poll(0.1)
        assert server.table.counters["rejected_short"] == 1
        server.write_live()
        live = campaign / "live.json"
        assert stat.S_IMODE(os.stat(live).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(campaign).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(campaign / "secret").st_mode) == 0o600
        doc = json.loads(live.read_text())
        assert [(r["node"], r["rank"]) for r in doc["ranks"]] == [("nodeA", 0), ("nodeA", 1)]
        assert server.send("nodeA", [wire.Command(wire.CMD_DUMP_STACKS, 1)])
        assert not server.send("nobody", [wire.Command(wire.CMD_EXIT)])
        got = []
        while len(got) < 2:  # the keepalive the poll loop sent to the new node, then our request
            ctl = wire.decode(key, agent.recvfrom(70000)[0], "9")
            assert ctl.node == "nodeA"
            got += wire.commands(ctl)
        assert got == [wire.Command(wire.CMD_KEEPALIVE), wire.Command(wire.CMD_DUMP_STACKS, 1, 0)]
    finally:
        agent.close()
        server.close()


def test_server_builds_latest_and_live_json_in_slices_keeping_the_worst_ranks(tmp_path: Path) -> None:
    server = AggregatorServer(tmp_path / "c", "9", live_interval_s=0.0, max_rank_rows=3)
    try:
        now = time.time_ns()
        for n in range(5):  # 5 nodes x 4 ranks; rank 6 stopped, rank 13 has the oldest beat
            ranks = [entry(4 * n + i, 1, age_ms=100 + (5000 if 4 * n + i == 13 else 4 * n + i),
                           state=wire.ST_STOPPED if 4 * n + i == 6 else wire.ST_RUNNING) for i in range(4)]
            assert server.table.feed(wire.encode_summary(server.key, instance=n, seq=1, wall_ns=now, mono_ns=1,
                                                         job="9", node=f"n{n}", ranks=ranks), ("127.0.0.1", 9))
        server._live_steps = lambda chunk=2, _f=server._live_steps: _f(chunk)  # type: ignore[method-assign]
        for _ in range(20):
            server.poll(0)
        assert server.latest is not None and len(server.latest.ranks) == 20 and len(server.latest.nodes) == 5
        doc = json.loads((tmp_path / "c" / "live.json").read_text())
        assert [r["rank"] for r in doc["ranks"]] == [6, 13, 19] and doc["ranks_total"] == 20
    finally:
        server.close()
