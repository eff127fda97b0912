"""Wait, at a restart, until the new rendezvous's store listens, before the program's ``init_process_group``.

WHY: torch's TCPStore client retries a refused connection with a growing back-off, and every rank's
``init_process_group`` waits for the slowest to connect. At a warm restart the ranks come to the rendezvous at
different moments (the kept ones take their order within a poll, a standby first runs the program's script, a rank
started again starts a process), so a rank that knocks before rank 0 has opened the store often sleeps past its
opening: measured with torch 2.13 and gloo, two ranks, rank 0 0.2-1.0 s late, ``init_process_group`` returned
0.26-0.53 s after rank 0 called it; with this wait (a plain TCP connect every 10 ms, closed at once) 7-26 ms. The
store takes the empty connection as a client that left.

Only ranks other than 0 wait (rank 0 opens the store), only for ``MASTER_ADDR:MASTER_PORT`` (what a restart order
sets), and never longer than ``WAIT_S``: a program that rendezvous elsewhere loses at most that, then goes on as
without the wait. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

WAIT_S = 20.0
POLL_S = 0.01
CONNECT_TIMEOUT_S = 0.5


def store_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where this rank's new rendezvous store listens, when it is for this rank to wait for it: MASTER_ADDR and a
    valid MASTER_PORT, and a rank other than 0; None otherwise (rank 0, or no rendezvous named)."""
    host, port, rank = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", ""), environ.get("RANK", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or rank in ("", "0"):
        return None
    return host, int(port)


def wait_for_store(environ: Mapping[str, str] = os.environ, wait_s: float = WAIT_S) -> float | None:
    """Block until the store of ``environ``'s rendezvous accepts a connection; the seconds waited, or None when
    there was nothing to wait for or it did not open within ``wait_s`` (the program's own rendezvous then
    waits, as it would have)."""
    address = store_address(environ)
    if address is None:
        return None
    start = time.monotonic()
    deadline = start + wait_s
    while True:
        try:
            with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S):
                return time.monotonic() - start
        except OSError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
