"""Helpers for tests that run `supervise site serve` as its own process on loopback (docs/site.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_site(site: Path, cwd: Path, *flags: str) -> tuple[str, subprocess.Popen[str], str]:
    """The service on a free loopback port: (its URL, the process, the first line it printed)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "site", "serve", "--dir", str(site),
                               "--listen", f"127.0.0.1:{port}", *flags], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=cwd,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    first = server.stdout.readline() if server.stdout is not None else ""
    return f"http://127.0.0.1:{port}", server, first
