"""A threading HTTP server that holds at most ``max_connections`` connections: one more is closed at once, so a
flood of connections (or clients that connect and send nothing) cannot take every thread of a service that must
stay up (the campaign's metrics endpoint, the site service). Stdlib only."""

from __future__ import annotations

import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Any


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # too many open connections: drop this one at once
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
