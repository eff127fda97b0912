"""Alerts: filled fields for every class, delivery to a loopback webhook, dedup under a burst, escalation, and
sinks that fail, answer garbage or hang never block or raise into the caller."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from supervisor import alert_sinks, alerts
from supervisor.config import AlertConfig
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.classify import Interruption
from supervisor.decisions.detect.findings import DetectionEvent


class _Recorder(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook():
    handler = type("H", (_Recorder,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler.received
    server.shutdown()
    server.server_close()


def _alert(cls: str = "hang", nodes: tuple[str, ...] = ("node2",), tier: str = "L4") -> alerts.Alert:
    action = policy.Action(policy.ALERT, tier, nodes, f"{cls}: evidence", {"class": cls}).to_event(1.0)
    det = DetectionEvent("rank_hang", (3,), nodes, "beat_age_s", 42.0, 15.0, 42.0).to_dict()
    return alerts.build("123", "/runs/c", action, [det], {"class": cls, "blamed_nodes": list(nodes)}, t=1.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_every_class_gets_filled_fields_from_the_policy_decision() -> None:
    """The decision the policy takes for each class, turned into an alert: no empty field, whatever evidence."""
    alloc = policy.Allocation(nodes=("node1", "node2"), needed=2, step_running=True)
    for cls in ev.INTERRUPTION_CLASSES:
        blamed = ("node2",) if cls in ("node_failure", "hardware", "hang", "comm_error") else ()
        interruption = Interruption(cls, blamed, 0.9, (f"{cls} evidence line",))
        decision = policy.decide(interruption, policy.History(), alloc, now=50.0)
        alert_action = next(a for a in decision.actions if a.kind == policy.ALERT)
        alert = alerts.build("777", "/runs/x", alert_action.to_event(50.0), [],
                             interruption.to_event(50.0), streak=1, budget=policy.PolicyConfig().budgets[cls],
                             ran_s=12.5, actions_taken=[a.kind for a in decision.actions])  # fmt: skip
        assert alert.empty_fields() == [], (cls, alert)
        assert alert.cls == cls and alert.job_id == "777" and alert.tier in alerts.TIERS
        assert alert.duration_s == 12.5 and alert.value == 1
        assert alerts.NOT_MEASURED not in (alert.metric, alert.value, alert.threshold, alert.duration_s)
        assert "alert" not in alert.action_taken.split(", ")
    for kind in ("straggler", "loss_spike"):
        detection = DetectionEvent(kind, (5,), ("node3",), "iter_ewma_s", 2.4, 1.5, 30.0)
        action = next(a for a in policy.respond_to_warning(detection) if a.kind == policy.ALERT)
        alert = alerts.build("777", "/runs/x", action.to_event(1.0), [detection.to_dict()])
        assert alert.empty_fields() == [] and alert.tier == "L2"
        assert (alert.metric, alert.value, alert.threshold, alert.duration_s) == ("iter_ewma_s", 2.4, 1.5, 30.0)


def test_missing_evidence_is_said_not_left_blank() -> None:
    alert = alerts.build("1", "c", {"kind": "alert", "tier": "L2", "params": {"class": "unknown"}})
    assert alert.empty_fields() == []
    assert alert.threshold == alerts.NOT_MEASURED and alert.duration_s == alerts.NOT_MEASURED


def test_webhook_delivered_to_a_loopback_server_as_slack_json(webhook) -> None:
    url, received = webhook
    dispatcher = alerts.Dispatcher([alert_sinks.WebhookSink(url, timeout_s=5)])
    assert dispatcher.submit(_alert())
    assert dispatcher.flush(30)
    dispatcher.close()
    (doc,) = received
    assert doc["text"].startswith("[L4] hang on node2 (job 123): beat_age_s = 42.0 (threshold 15.0")
    assert (doc["class"], doc["nodes"], doc["metric"], doc["value"], doc["threshold"]) == (
        "hang", ["node2"], "beat_age_s", 42.0, 15.0)
    assert doc["action_taken"] and doc["suggested_action"] and doc["campaign"] == "/runs/c"


def test_burst_is_deduplicated_by_class_and_nodes_with_a_cooldown(webhook) -> None:
    url, received = webhook
    clock = FakeClock()
    dispatcher = alerts.Dispatcher([alert_sinks.WebhookSink(url)], cooldown_s=60, clock=clock)
    results = [dispatcher.submit(_alert("straggler", ("node3",), "L2")) for _ in range(50)]
    results.append(dispatcher.submit(_alert("straggler", ("node4",), "L2")))  # other nodes: its own alert
    assert results.count(True) == 2
    clock.now += 61
    assert dispatcher.submit(_alert("straggler", ("node3",), "L2"))
    assert dispatcher.flush(30)
    dispatcher.close()
    assert [(d["nodes"], d["repeats"]) for d in received] == [(["node3"], 0), (["node4"], 0), (["node3"], 49)]
    assert dispatcher.stats["suppressed"] == 49


def test_higher_tier_breaks_the_cooldown_and_l3_goes_to_the_escalation_sink(webhook) -> None:
    url, received = webhook
    pager: list[alerts.Alert] = []

    class Pager:
        name = "pager"

        def send(self, alert: alerts.Alert) -> None:
            pager.append(alert)

    dispatcher = alerts.Dispatcher([alert_sinks.WebhookSink(url)], [Pager()], cooldown_s=3600)
    assert dispatcher.submit(_alert("hang", ("node2",), "L2"))
    assert dispatcher.submit(_alert("hang", ("node2",), "L4"))  # same key, escalated: sent anyway
    assert not dispatcher.submit(_alert("hang", ("node2",), "L4"))
    assert not dispatcher.submit(_alert("hang", ("node2",), "L1"))  # below min_tier: log only
    assert dispatcher.flush(30)
    dispatcher.close()
    assert [d["tier"] for d in received] == ["L2", "L4"]
    assert [a.tier for a in pager] == ["L4"]


def _garbage_server(reply: bytes | None, release: threading.Event, connected: threading.Event) -> tuple[str, socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            connected.set()
            conn.recv(65536)
            if reply is None:
                release.wait(60)  # hang until the test is done
            else:
                conn.sendall(reply)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/", sock


@pytest.mark.parametrize("reply", [b"HELLO GARBAGE\r\n\r\n", b"\x00\xff" * 100, b"", None],
                         ids=["garbage-status", "binary", "close", "hang"])
def test_a_bad_sink_never_blocks_or_raises_into_the_caller(reply: bytes | None) -> None:
    release, connected = threading.Event(), threading.Event()
    url, sock = _garbage_server(reply, release, connected)
    try:
        dispatcher = alerts.Dispatcher([alert_sinks.WebhookSink(url, timeout_s=2)], retries=2, retry_wait_s=0.01)
        assert dispatcher.submit(_alert())
        if reply is None:
            assert connected.wait(30)
            # The sink is stuck in the server right now, and the caller is free: more alerts are taken.
            assert dispatcher.submit(_alert("hardware", ("node1",)))
            assert not release.is_set()
        assert dispatcher.flush(60)
        assert dispatcher.stats["failed"] >= 1 and dispatcher.stats["delivered"] == 0
        dispatcher.close()
    finally:
        release.set()
        sock.close()


def test_a_drip_feeding_webhook_costs_one_timeout_per_try_not_one_per_read() -> None:
    """Issue 22, low: the timeout applied per read, so a server sending one byte a second held a try for as long
    as it liked (> 15 s seen with a 5 s timeout), and later alerts queued and were dropped."""
    stop = threading.Event()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)

    def drip() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
                if stop.wait(0.5):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            return
        finally:
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    sink = alert_sinks.WebhookSink(f"http://127.0.0.1:{sock.getsockname()[1]}/hook", timeout_s=2.0)
    started = time.monotonic()
    try:
        with pytest.raises(alert_sinks.SinkError, match="no answer within 2 s"):
            sink.send(_alert())
        assert time.monotonic() - started < 10.0  # one 2 s budget, not 2 s for each of ~100 reads
    finally:
        stop.set()
        sock.close()


def test_a_webhook_url_python_cannot_use_is_the_sinks_error_not_an_escape() -> None:
    with pytest.raises(alert_sinks.SinkError):
        alert_sinks.WebhookSink("http://[::1/broken", timeout_s=1.0).send(_alert())  # Request() raised ValueError


def test_a_failing_command_is_retried_then_logged(tmp_path) -> None:
    out = tmp_path / "alert.json"
    script = f"import sys; open({str(out)!r}, 'ab').write(sys.stdin.buffer.read()); sys.exit(1)"
    dispatcher = alerts.Dispatcher([alert_sinks.CommandSink([sys.executable, "-c", script])], retries=3, retry_wait_s=0.01)
    assert dispatcher.submit(_alert())
    assert dispatcher.flush(60)
    dispatcher.close()
    assert dispatcher.stats["failed"] == 1
    assert out.read_bytes().count(b'"class": "hang"') == 3  # three tries, each with the alert on stdin


def test_full_queue_drops_instead_of_blocking() -> None:
    gate = threading.Event()

    class Slow:
        name = "slow"

        def send(self, alert: alerts.Alert) -> None:
            gate.wait(30)

    dispatcher = alerts.Dispatcher([Slow()], queue_size=2, cooldown_s=0)
    accepted = [dispatcher.submit(_alert("hang", (f"n{i}",))) for i in range(10)]
    gate.set()
    assert accepted.count(False) >= 7 and dispatcher.stats["dropped"] >= 7
    dispatcher.flush(30)
    dispatcher.close()


def test_config_builds_the_sinks_and_rejects_bad_ones() -> None:
    primary, escalation = alert_sinks.sinks_from_config(AlertConfig(webhook_url="https://hooks.example/x",
                                                               escalation_command=("/bin/true",)))  # fmt: skip
    assert [type(s).__name__ for s in primary] == ["WebhookSink"]
    assert [type(s).__name__ for s in escalation] == ["CommandSink"]
    with pytest.raises(ValueError, match="not an http"):
        alerts.validate_config(AlertConfig(webhook_url="file:///etc/passwd"))
    with pytest.raises(ValueError, match="escalate_tier"):
        alerts.validate_config(AlertConfig(escalate_tier="L7"))
    with pytest.raises(ValueError, match="timeout_s"):
        alerts.validate_config(AlertConfig(timeout_s=float("nan")))


def test_apprise_sink_when_installed() -> None:
    pytest.importorskip("apprise")
    sink = alert_sinks.AppriseSink(["json://127.0.0.1:9/"])  # nothing listens on port 9: the send fails cleanly
    with pytest.raises(alert_sinks.SinkError):
        sink.send(_alert())
    with pytest.raises(ValueError, match="does not understand"):
        alert_sinks.AppriseSink(["nosuchscheme://x"])


def test_for_decision_is_the_loops_one_call() -> None:
    alloc = policy.Allocation(nodes=("node1", "node2"), needed=2, step_running=True)
    interruption = Interruption("comm_error", ("node2",), 0.8, ("NCCL WARN ...",))
    history = policy.History(streaks={"comm_error": 1})
    decision = policy.decide(interruption, history, alloc, now=5.0)
    alert = alerts.for_decision("55", "/c", decision, interruption, history=history,
                                budgets=policy.PolicyConfig().budgets, ran_s=600.0, t=5.0)  # fmt: skip
    assert alert is not None and alert.empty_fields() == []
    assert (alert.value, alert.threshold, alert.duration_s) == (2, "budget 3 restarts", 600.0)
    assert "restart_in_allocation" in alert.action_taken
    finish = policy.decide(Interruption("completed", (), 1.0, ()), policy.History(), alloc)
    assert alerts.for_decision("55", "/c", finish) is None
