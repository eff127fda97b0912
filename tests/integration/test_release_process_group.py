"""A rank that lets go of its failed process group (``client.restartable``) must release its peers at once, not
when its process ends: with torch 2.13, a gloo group built before ``torch._dynamo`` is imported (which creating an
optimizer does) keeps its connections after destroy or abort, and its peers stay blocked on the waiting rank (on
the local cluster, a whole torchrun launch's survivors stalled and the warm restart went cold). The client imports
dynamo before the training function runs: the user-style probe (tests/integration/programs/release_probe.py)
shows the peer failing within seconds and the waiting rank holding no socket."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).parent / "programs" / "release_probe.py"


def run_pair(*flags: str) -> tuple[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, str(PROBE), "--rank", str(r), "--port", port, *flags], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in (0, 1)]  # fmt: skip
    out = [p.communicate(timeout=120)[0] for p in procs]
    return out[0], out[1]


def test_the_peer_of_a_rank_that_released_its_group_fails_at_once_and_no_socket_is_kept() -> None:
    peer, waiting = run_pair("--dynamo-first")
    assert waiting.strip() == "released 0", waiting  # its gloo connections closed, though its process lives on
    seconds = float(peer.split()[-1])
    assert seconds < 5.0, f"rank 0 stayed blocked {seconds} s on the rank that let go (it lives 8 s)"
