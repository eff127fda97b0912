"""The Prometheus endpoint, scraped over loopback: per-rank series from a live document, counters and goodput
from journal events, fed through the one update call the loop makes; off unless configured."""

from __future__ import annotations

import socket
import time
import urllib.request
from typing import Any

import pytest

from supervisor import metrics, metrics_server
from supervisor.decisions import campaign_state
from supervisor.decisions import events as ev

pytest.importorskip("prometheus_client")

LIVE = {
    "job": "4242",
    "ranks": [
        {"rank": 0, "node": "node1", "steps_per_s": 2.0, "ewma_steps_per_s": 2.1, "beat_age_s": 0.3, "ewma_s": 0.5},
        {"rank": 1, "node": "node2", "steps_per_s": None, "ewma_steps_per_s": 1.0, "beat_age_s": 7.5, "ewma_s": 1.0},
        {"rank": 2, "node": "node3", "steps_per_s": None, "ewma_steps_per_s": None, "beat_age_s": None, "ewma_s": None},
    ],
}
EVENTS = [
    ev.campaign_started(1000.0, "/runs/c", ["python", "train.py"], "4242"),
    ev.attempt_started(1001.0, "4242", 0, ["node1", "node2", "node3"], None),
    ev.step_launched(1002.0, 1, ["node1", "node2", "node3"]),
    ev.checkpoint_committed(1050.0, 100, "/ckpt/100"),
    ev.interruption_event(1060.0, "hang", ["node2"], 0.9, ["rank 1 silent"]),
    {"type": "nodes_excluded", "t": 1061.0, "nodes": ["node2"]},
    ev.step_launched(1062.0, 2, ["node1", "node3"], ["node2"]),
    ev.interruption_event(1070.0, "app_error", [], 0.8, ["exit 1"]),
    ev.step_launched(1071.0, 3, ["node1", "node3"], ["node2"]),
]


def _scrape(address: tuple[str, int]) -> str:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as response:  # noqa: S310
        return response.read().decode()


def _value(text: str, prefix: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


def test_scraped_on_loopback() -> None:
    m = metrics.Metrics("/runs/c", clock=lambda: 1100.0)
    address = m.serve("127.0.0.1:0")
    try:
        state = campaign_state.fold(EVENTS[:4])
        m.update(LIVE, state)
        for e in EVENTS[4:]:  # the loop applies each event it journals to the state it keeps
            state.apply(e)
        m.goodput_at = m.rendered_at = float("-inf")  # (recomputed at most every GOODPUT_S, RENDER_S)
        m.update(LIVE, state)
        text = _scrape(address)
    finally:
        m.close()
    lab = 'campaign="/runs/c",job="4242"'
    assert _value(text, f'supervise_rank_step_rate{{{lab},node="node1",rank="0"}}') == 2.0
    assert _value(text, f'supervise_rank_step_rate{{{lab},node="node2",rank="1"}}') == 1.0  # EWMA when no interval
    assert _value(text, f'supervise_rank_beat_age_seconds{{{lab},node="node2",rank="1"}}') == 7.5
    assert 'rank="2"' not in text  # a rank that never beat has no rate or age, not a zero
    assert _value(text, f'supervise_iteration_seconds{{{lab},quantile="0.5"}}') == 0.5
    assert _value(text, f'supervise_iteration_seconds{{{lab},quantile="0.99"}}') == 1.0
    assert _value(text, 'supervise_interruptions_total{campaign="/runs/c",class="hang",job="4242"}') == 1
    assert _value(text, 'supervise_interruptions_total{campaign="/runs/c",class="app_error",job="4242"}') == 1
    assert _value(text, f"supervise_restarts_total{{{lab}}}") == 2
    assert _value(text, f"supervise_excluded_nodes{{{lab}}}") == 1
    assert _value(text, f'supervise_excluded_node{{{lab},node="node2"}}') == 1
    assert _value(text, f"supervise_checkpoint_age_seconds{{{lab}}}") == 50.0
    assert _value(text, f"supervise_checkpoint_step{{{lab}}}") == 100
    assert _value(text, f'supervise_goodput_seconds{{{lab},kind="wall"}}') == 100.0
    assert 0 < _value(text, f"supervise_goodput_ratio{{{lab}}}") <= 1


def test_off_by_default_and_listen_validated() -> None:
    assert metrics.start(metrics.MetricsConfig()) is None
    for bad in ("9464", "localhost:9464", "127.0.0.1:99999", "127.0.0.1:x", ":9464"):
        with pytest.raises(ValueError, match="metrics.listen"):
            metrics.MetricsConfig(listen=bad)
    with pytest.raises(ValueError, match="unknown setting"):
        metrics.MetricsConfig.from_mapping({"port": 9464})
    with pytest.raises(ValueError, match="not a loopback address"):  # issue 22: any address was accepted
        metrics.MetricsConfig(listen="0.0.0.0:9464")
    remote = metrics.MetricsConfig(listen="0.0.0.0:9464", allow_remote=True)
    assert remote.remote and not metrics.MetricsConfig(listen="[::1]:9464").remote
    assert metrics.parse_listen("[::1]:9464") == ("::1", 9464)


def test_started_from_config_and_a_bad_update_never_raises() -> None:
    m = metrics.start(metrics.MetricsConfig(listen="127.0.0.1:0"), campaign="/runs/x")
    assert m is not None and m.address is not None
    try:
        m.update({"ranks": "garbage"}, campaign_state.fold([{"type": "interruption"}]))
        m.update(None, "not a state")  # type: ignore[arg-type]
        assert "supervise_restarts_total" in _scrape(m.address)
    finally:
        m.close()


def test_quantile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert metrics.quantile(values, 0.5) == 50.0 and metrics.quantile(values, 0.99) == 99.0
    assert metrics.quantile([3.0], 0.9) == 3.0


def test_fed_with_the_aggregators_snapshot() -> None:
    """The loop can hand over ``server.latest`` as it is (real frames fed to a LiveTable); rows are chosen at
    scrape time."""
    import time

    from supervisor.heartbeat import wire
    from supervisor.heartbeat.table import LiveTable

    key = wire.derive_key(b"m" * 32)
    table = LiveTable(key, "77", rate_window_s=1.0)
    now = time.time_ns()
    for seq, (mono, step) in enumerate([(0, 0), (1, 10), (2, 20)], start=1):
        ranks = [wire.RankEntry(r, 100 + r, step + r, 1, wire.ST_RUNNING, 0, 0, 50, 0.1, 0.1, 0.1, 0.5, step, step,
                                -1, 0, 1.0) for r in (0, 1)]  # fmt: skip
        table.feed(wire.encode_summary(key, instance=1, seq=seq, wall_ns=now, mono_ns=mono * 10**9, job="77",
                                       node="node1", ranks=ranks))  # fmt: skip
    m = metrics.Metrics("/runs/s")
    address = m.serve("127.0.0.1:0")
    try:
        m.rendered_at = float("-inf")
        m.update(table.snapshot(), campaign_state.fold(EVENTS))
        text = _scrape(address)
    finally:
        m.close()
    assert _value(text, 'supervise_rank_step_rate{campaign="/runs/s",job="77",node="node1",rank="1"}') == 10.0
    assert _value(text, 'supervise_iteration_seconds{campaign="/runs/s",job="77",quantile="0.5"}') == pytest.approx(0.1)


def test_a_scrape_copies_the_page_the_loop_rendered_and_never_runs_the_collectors() -> None:
    """Issue 22: each scrape folded the report under the loop's lock; four scrapers cut heartbeat intake 20x."""
    m = metrics.Metrics("/runs/c", clock=lambda: 1100.0)
    collected = []
    real = m.collect

    def counting() -> Any:
        collected.append(1)
        return real()

    m.collect = counting  # type: ignore[method-assign]
    address = m.serve("127.0.0.1:0")  # (renders the first page)
    try:
        m.rendered_at = float("-inf")
        m.update(LIVE, campaign_state.fold(EVENTS))
        renders = len(collected)
        pages = [_scrape(address) for _ in range(5)]
        assert len(collected) == renders  # five scrapes, no collector run
        assert len(set(pages)) == 1 and "supervise_restarts_total" in pages[0]
        m.update(LIVE, campaign_state.fold(EVENTS))  # within RENDER_S of the last render: not rendered again
        assert len(collected) == renders
    finally:
        m.close()


def _request(address: tuple[str, int], head: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_endpoint_caps_the_request_rate_and_ignores_a_malformed_accept_header() -> None:
    server, _ = metrics_server.serve("127.0.0.1", 0, rate_per_s=0.01)  # one request, then one per 100 s
    server.publish(b"supervise_up 1\n")
    address = server.server_address[:2]
    try:
        odd = _request(address, b"GET /metrics HTTP/1.0\r\nAccept: text/plain;version=abc;q=x\r\n\r\n")
        assert odd.startswith(b"HTTP/1.0 200") and odd.endswith(b"supervise_up 1\n")  # prometheus-client: 500
        codes = {_request(address, b"GET /metrics HTTP/1.0\r\n\r\n").split(b" ")[1] for _ in range(3)}
        assert codes == {b"429"}  # beyond the rate: refused, not served
        assert _request(address, b"GET /etc/passwd HTTP/1.0\r\n\r\n").split(b" ")[1] == b"404"
        assert _request(address, b"POST /metrics HTTP/1.0\r\n\r\n").split(b" ")[1] == b"405"
    finally:
        server.shutdown()
        server.server_close()


def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    server, _ = metrics_server.serve("127.0.0.1", 0, max_connections=2, timeout_s=30.0)
    address = server.server_address[:2]
    idle = [socket.create_connection(address, timeout=10) for _ in range(2)]  # they send nothing
    try:
        time.sleep(0.2)
        third = socket.create_connection(address, timeout=10)
        with third:
            third.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert third.recv(100) == b""  # closed without an answer while two idle ones hold the slots
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()
