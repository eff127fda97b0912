"""Serving the metrics page: a rendered page handed over by the supervision loop, served as it is.

Why not prometheus-client's own server: there a scrape runs the collectors under the loop's lock, so every
scraper costs the supervisor work (four scrapers cut heartbeat intake from 41,888 to 1,856 frames/s at 2,048
nodes, issue 22), and its content negotiation answers 500 to a malformed ``Accept`` header. Here the loop renders
the page when it updates the figures (``Metrics.update``), and a scrape only copies bytes: the supervisor does the
same work however many scrapers there are. Requests beyond ``rate_per_s`` (a token bucket) get 429, connections
beyond ``max_connections`` are closed at once, and a connection that sends nothing is dropped after
``timeout_s``. Only GET of ``/metrics`` (or ``/``) is served; ``Accept`` is ignored (the text format always).
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any

from supervisor.bounded_http import BoundedHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text exposition format


class TokenBucket:
    """``rate`` requests per second on average, bursts of up to ``burst``. Thread-safe."""

    def __init__(self, rate: float, burst: float, clock: Any = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.at = burst, clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1.0:
                return False
            self.tokens -= 1.0
            return True


class _Handler(http.server.BaseHTTPRequestHandler):
    server: PageServer
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive connections to hold

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_s)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self._answer(404, b"not found\n", "text/plain")
        elif not self.server.bucket.take():
            self._answer(429, b"too many requests\n", "text/plain")
        else:
            self._answer(200, self.server.page, CONTENT_TYPE)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(405, b"", "text/plain")

    do_POST = do_PUT = do_DELETE = do_HEAD  # noqa: N815

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command == "GET":
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # scrapes are not the supervisor's log
        return None


class PageServer(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], *, rate_per_s: float = 10.0, max_connections: int = 8,
                 timeout_s: float = 5.0) -> None:  # fmt: skip
        self.page = b""
        self.bucket = TokenBucket(rate_per_s, max(1.0, rate_per_s))
        self.timeout_s = timeout_s
        super().__init__(address, _Handler, max_connections)

    def publish(self, page: bytes) -> None:
        """The page every scrape gets from now on (one reference swap: no lock, no copy)."""
        self.page = page


def serve(host: str, port: int, **limits: Any) -> tuple[PageServer, threading.Thread]:
    server = PageServer((host, port), **limits)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
