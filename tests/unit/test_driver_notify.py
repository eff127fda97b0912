"""Warnings, alerts and metrics wired into the loop (issue 9 item 5, issue 12 items 5-6), driven through the
fakes: a straggler or loss spike gets the policy's answer (an L2 alert to the sinks; a strike journaled for a
straggler, folded by the ledger), a fault's alert goes through the dispatcher to a real loopback webhook with
every field filled, and the metrics endpoint is fed each pass and closed at the end."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import Launch
from test_driver import Run, make, run

from supervisor.config import from_mapping
from supervisor.decisions import campaign_state, policy
from supervisor.decisions import events as ev
from supervisor.decisions.detect import DetectionEvent
from supervisor.decisions.ledger import LedgerConfig

DONE = {"state": "exited", "exit_code": 0}


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback Slack-style webhook that keeps what it was sent."""
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    server.shutdown()
    server.server_close()


def with_warnings(tmp_path: Path, warnings: list[DetectionEvent], config: dict[str, Any]) -> Run:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, polls=300, ranks=DONE)])
    queue = list(warnings)

    def observe(snapshot: Any, now: float) -> list[DetectionEvent]:
        return [queue.pop(0)] if queue else []

    sup.detector.observe = observe  # type: ignore[method-assign]
    sup.config = from_mapping({**config, "run": {"loop_interval_s": 0.05}})
    return run(sup, slurm, launcher, channel)


STRAGGLER = DetectionEvent("straggler", ranks=(1,), nodes=("n2",), metric="steps_per_s_vs_median", value=0.4,
                           threshold=0.7, duration_s=120.0, evidence=("rank 1 at 40% of the median rate",))
SPIKE = DetectionEvent("loss_spike", ranks=(0,), nodes=("n1",), metric="loss_zscore", value=9.5, threshold=6.0,
                       duration_s=0.0, evidence=("rank 0 step 40: loss 9.1 is 9.5 std above the mean",))


def test_a_straggler_warning_alerts_at_l2_and_strikes_its_node_and_the_run_goes_on(tmp_path: Path, webhook) -> None:
    url, got = webhook
    r = with_warnings(tmp_path, [STRAGGLER, STRAGGLER], {"alerts": {"webhook_url": url}})
    assert r.code == 0 and r.classes() == [ev.COMPLETED]  # a warning never stops the run
    kinds = [(e["kind"], e["tier"]) for e in r.of(ev.ACTION) if e["params"].get("warning") or
             e["params"].get("strike")]  # fmt: skip
    assert kinds.count((policy.ALERT, "L2")) == 2 and kinds.count((policy.MARK_SUSPECT, "L2")) == 2
    ledger = campaign_state.fold(r.events, LedgerConfig()).ledger
    assert ledger.table(r.events[-1]["t"])[0]["node"] == "n2"  # the ledger folded the journaled strikes
    assert len(got) == 1  # the burst is one message (dedup by class and nodes within the cooldown)
    alert = got[0]
    assert alert["class"] == "straggler" and alert["tier"] == "L2" and alert["nodes"] == ["n2"]
    assert (alert["metric"], alert["value"], alert["threshold"], alert["duration_s"]) == (
        "steps_per_s_vs_median", 0.4, 0.7, 120.0)
    assert alert["job_id"] == "7" and alert["campaign"] and "mark_suspect" in alert["action_taken"]


def test_a_loss_spike_alerts_without_striking_unless_configured(tmp_path: Path, webhook) -> None:
    url, got = webhook
    r = with_warnings(tmp_path, [SPIKE], {"alerts": {"webhook_url": url}})
    assert [e["kind"] for e in r.of(ev.ACTION) if e["params"].get("warning") or e["params"].get("strike")] == [
        policy.ALERT]
    assert got and got[0]["class"] == "loss_spike" and got[0]["metric"] == "loss_zscore"


def test_a_faults_alert_goes_through_the_dispatcher_with_every_field_filled(tmp_path: Path, webhook) -> None:
    url, got = webhook
    nan = Launch(None, ranks={"loss": float("nan"), "loss_step": 12}, stops_on_flags=False)
    sup, slurm, launcher, channel, _ = make(tmp_path, [nan])
    sup.config = from_mapping({"alerts": {"webhook_url": url},
                               "policy": {"budgets": {"numerical": 0}}})  # a NaN stops at once: one alert  # fmt: skip
    r = run(sup, slurm, launcher, channel)  # the dispatcher is closed (flushed) before run() returns
    assert r.code == 1
    assert len(got) == 1 and got[0]["class"] == "numerical" and got[0]["tier"] in ("L3", "L4")
    assert not [k for k, v in got[0].items() if v in (None, "") and k != "repeats"]


def test_metrics_are_served_fed_each_pass_and_closed(tmp_path: Path, monkeypatch) -> None:
    from supervisor import metrics

    served: list[metrics.Metrics] = []
    scraped: list[str] = []
    real_start = metrics.start

    def start(config: Any, campaign: str = "", job_id: str = "") -> Any:
        m = real_start(config, campaign, job_id)
        served.append(m)
        return m

    monkeypatch.setattr(metrics, "start", start)
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, polls=300, ranks=DONE)])
    sup.config = from_mapping({"metrics": {"listen": "127.0.0.1:0"}, "run": {"loop_interval_s": 0.05}})
    real_update = metrics.Metrics.update

    def update(self: metrics.Metrics, live: Any, events: Any) -> None:
        real_update(self, live, events)
        if not scraped and self.address is not None:
            host, port = self.address
            scraped.append(urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode())

    monkeypatch.setattr(metrics.Metrics, "update", update)
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and len(served) == 1 and served[0] is not None
    assert 'supervise_rank_beat_age_seconds{campaign=' in scraped[0] and 'job="7"' in scraped[0]
    assert served[0]._server is None  # closed at exit
