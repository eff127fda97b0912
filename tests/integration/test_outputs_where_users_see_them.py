"""Issue 25, outputs checked where users see them: a campaign on the real local Slurm with ``[metrics] listen``
and ``[alerts] webhook_url`` set, as README's configuration shows. Its ``/metrics`` page is scraped with
prometheus-client's own parser while it trains (the values move: steps, the checkpoint step, goodput seconds);
a rank is stopped (SIGSTOP: a hang), and a loopback webhook receives the alert of that real fault with every
field filled (metric, value, threshold, duration, job, action taken), once; after the relaunch the page counts
the interruption by class and the restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from campaign_tools import cancel, launches, live_rank, rank_pid, submit, wait_for

pytest.importorskip("torch")
parser = pytest.importorskip("prometheus_client.parser")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150


class Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    handler = type("H", (Receiver,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler.received
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> dict[str, list[Any]]:
    """Metric family name -> its samples, as prometheus-client parses the page."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback, our own endpoint
    return {f.name: list(f.samples) for f in parser.text_string_to_metric_families(text)}


def value(page: dict[str, list[Any]], family: str, **labels: str) -> float | None:
    for sample in page.get(family, []):
        if all(sample.labels.get(k) == v for k, v in labels.items()) and not sample.name.endswith("_created"):
            return float(sample.value)
    return None


def test_metrics_move_and_a_real_hangs_alert_arrives_once_with_every_field(tmp_path: Path, webhook) -> None:
    url, received = webhook
    port = free_port()
    config = f'[alerts]\nwebhook_url = "{url}"\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    camp = submit(tmp_path, steps=120, ckpt_every=10, step_time=0.3, config=config)
    page_url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for("rank 0 past step 12", lambda: rank_pid(camp, 0, min_step=12), START_TIMEOUT)
        first = wait_for("a metrics page with the ranks", lambda: (p := scrape(page_url)).get("supervise_rank_step_rate")
                         and value(p, "supervise_checkpoint_step") and p, 30)  # fmt: skip
        assert {s.labels["rank"] for s in first["supervise_rank_step_rate"]} == {"0", "1"}
        time.sleep(4)
        def moved(p: dict[str, list[Any]], family: str, **labels: str) -> bool:
            return (value(p, family, **labels) or 0) > (value(first, family, **labels) or 0)

        # The checkpoint step moves with each checkpoint; the goodput figures are recomputed every 10 s.
        wait_for("the checkpoint step and the wall time to move", lambda: (p := scrape(page_url)) and
                 moved(p, "supervise_checkpoint_step") and moved(p, "supervise_goodput_seconds", kind="wall"), 30)  # fmt: skip
        assert value(first, "supervise_interruptions", **{"class": "hang"}) in (None, 0.0)

        before = len(launches(camp))
        stopped = live_rank(camp.root, 0)
        assert stopped is not None
        os.kill(int(stopped["pid"]), signal.SIGSTOP)
        relaunch = wait_for("the relaunch", lambda: launches(camp)[before:] or None, 90)[0]
        alerts = wait_for("the hang's alert", lambda: [a for a in received if a.get("class") == "hang"], 30)
        time.sleep(3)  # anything sent twice would have arrived by now
        hang = [a for a in received if a.get("class") == "hang"]
        assert len(hang) == 1, hang  # once, not once per rank or per pass
        alert = alerts[0]
        assert alert["tier"] == "L4" and alert["job_id"] == camp.job_id and alert["campaign"] == str(camp.root)
        for field in ("metric", "value", "threshold", "duration_s", "action_taken", "message", "suggested_action"):
            assert alert[field] not in ("", None, [], "not measured"), (field, alert)
        assert "killed the step" in alert["action_taken"] and alert["nodes"] == [stopped["node"]], alert
        assert alert["text"] and "hang" in alert["text"]  # Slack-compatible summary

        wait_for("rank 0 of the relaunch stepping", lambda: rank_pid(camp, 0, min_step=(relaunch["resume_step"] or 0) + 2),
                 90)  # fmt: skip
        after = wait_for("the interruption counted", lambda: (p := scrape(page_url)) and
                         value(p, "supervise_interruptions", **{"class": "hang"}) == 1.0 and p, 30)  # fmt: skip
        assert (value(after, "supervise_restarts") or 0) >= 1
        assert moved(after, "supervise_goodput_seconds", kind="productive")  # progress is journaled every 30 s
        assert (value(after, "supervise_goodput_seconds", kind="badput_restart") or 0) > 0  # the hang's relaunch
    finally:
        cancel(camp.job_id)
