"""Preflight on the local cluster: three nodes measured under srun (gloo on CPU); one rank throttled for real
(SIGSTOP/SIGCONT duty cycle, stopped 80 ms of every ~85 ms: a node at a fraction of its speed) is flagged as slow, and only it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from supervisor.health import preflight

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
NODES = ["node1", "node2", "node3"]
SLOW = "node3"


def _throttle(work: Path, node: str, stop: threading.Event) -> None:
    """Find the worker on ``node`` (its pid file) and keep it stopped most of the time until told to stop."""
    pid = None
    while pid is None and not stop.is_set():
        for path in work.glob("preflight-*/pid-*"):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("node") == node:
                pid = int(doc["pid"])
        time.sleep(0.01)
    try:
        while pid is not None and not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.08)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)
    except ProcessLookupError:
        pass
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_all_nodes_healthy_pass(slurm_cluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    verdict = preflight.run(NODES, tmp_path, budget_s=90)
    assert verdict.ok and not verdict.unknown, preflight.describe(verdict)
    assert set(verdict.figures) == set(NODES) and verdict.allreduce_busbw_Bps
    assert all("compute_s" in f for f in verdict.figures.values())
    assert verdict.to_event(1.0)["blamed_nodes"] == []


def test_a_throttled_rank_is_flagged_slow(slurm_cluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    stop = threading.Event()
    thread = threading.Thread(target=_throttle, args=(tmp_path, SLOW, stop), daemon=True)
    thread.start()
    try:
        verdict = preflight.run(NODES, tmp_path, budget_s=120)
    finally:
        stop.set()
        thread.join(30)
    assert not verdict.unknown, preflight.describe(verdict)
    assert verdict.blamed_nodes == (SLOW,), preflight.describe(verdict)
    assert "compute" in verdict.slow[SLOW]
