"""Where alerts go (``[alerts]``): a webhook (Slack-compatible JSON: ``text`` plus the alert's fields), a command
(an argument list, the JSON on stdin) and optionally any service apprise knows (``pip install apprise``). Each
send is bounded by its timeout and raises only ``SinkError``; retries, deduplication and escalation are the
``alerts.Dispatcher``'s.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from supervisor.alerts import Alert


class SinkError(Exception):
    """A sink did not take the alert (retried, then logged)."""


class Sink(Protocol):
    name: str

    def send(self, alert: Alert) -> None: ...


def _body(alert: Alert) -> bytes:
    return json.dumps({"text": alert.summary(), **alert.to_dict()}, sort_keys=True, default=str).encode()


class WebhookSink:
    """POST Slack-compatible JSON (``text`` is the one-line summary; the fields ride along at the top level)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"alert webhook {url!r} is not an http(s) URL")
        self.url, self.timeout_s, self.name = url, timeout_s, f"webhook {url.split('?')[0]}"

    def send(self, alert: Alert) -> None:
        """One POST, within ``timeout_s`` in all: the connection is shut down when the time is up, so a server
        that drip-feeds its answer (a byte per read, each within a per-read timeout) cannot hold the sender."""
        timer: threading.Timer | None = None
        conn: http.client.HTTPConnection | None = None
        expired = threading.Event()
        try:
            parts = urllib.parse.urlsplit(self.url)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname or "", parts.port, timeout=self.timeout_s)
            timer = threading.Timer(self.timeout_s, _shut, (conn, expired))
            timer.daemon = True
            timer.start()
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("POST", path, body=_body(alert), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read(4096)
            if response.status >= 400:
                raise SinkError(f"{self.name}: HTTP {response.status} {response.reason}")
        except SinkError:
            raise
        except Exception as err:  # noqa: BLE001 - OSError, timeouts, http.client's errors on garbage, a bad URL
            why = f"no answer within {self.timeout_s:g} s" if expired.is_set() else f"{type(err).__name__}: {err}"
            raise SinkError(f"{self.name}: {why}") from None
        finally:
            if timer is not None:
                timer.cancel()
            if conn is not None:
                conn.close()
        if expired.is_set():  # the answer came in the very moment the time was up: count it as late
            raise SinkError(f"{self.name}: no answer within {self.timeout_s:g} s")


def _shut(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The deadline: shut the connection's socket down under the sender (its blocking read returns at once)."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class CommandSink:
    """Run a command (argument list, never a shell) with the alert's JSON on stdin; killed after the timeout."""

    def __init__(self, argv: Sequence[str], timeout_s: float = 5.0) -> None:
        if not argv:
            raise ValueError("alert command is empty")
        self.argv, self.timeout_s, self.name = list(argv), timeout_s, f"command {argv[0]}"

    def send(self, alert: Alert) -> None:
        try:
            subprocess.run(self.argv, input=_body(alert), timeout=self.timeout_s, check=True,  # noqa: S603
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as err:
            raise SinkError(f"{self.name}: {err}") from None


class AppriseSink:
    """Any service apprise knows (``mailto://``, ``slack://``, ``msteams://``...): the optional ``apprise`` extra."""

    def __init__(self, urls: Sequence[str]) -> None:
        try:
            import apprise
        except ImportError:
            raise ValueError("alerts.apprise_urls needs apprise: pip install 'slurm-supervisor[alerts]'") from None
        self._apprise = apprise.Apprise()
        for url in urls:
            if not self._apprise.add(url):
                raise ValueError(f"apprise does not understand alert URL {url.split('://')[0]}://...")
        self.name = f"apprise ({len(urls)} services)"

    def send(self, alert: Alert) -> None:
        if not self._apprise.notify(title=f"supervise {alert.tier} {alert.cls}", body=alert.summary()):
            raise SinkError(f"{self.name}: a service refused the alert")


def sinks_from_config(config: Any) -> tuple[list[Sink], list[Sink]]:
    """(primary sinks, escalation sinks) from ``[alerts]``. Raises ValueError naming a bad setting."""
    timeout = float(getattr(config, "timeout_s", 5.0))
    primary: list[Sink] = []
    escalation: list[Sink] = []
    if getattr(config, "webhook_url", ""):
        primary.append(WebhookSink(config.webhook_url, timeout))
    if getattr(config, "command", ()):
        primary.append(CommandSink(config.command, timeout))
    if getattr(config, "apprise_urls", ()):
        primary.append(AppriseSink(config.apprise_urls))
    if getattr(config, "escalation_webhook_url", ""):
        escalation.append(WebhookSink(config.escalation_webhook_url, timeout))
    if getattr(config, "escalation_command", ()):
        escalation.append(CommandSink(config.escalation_command, timeout))
    return primary, escalation
