"""Preflight on the local cluster: three nodes measured under srun (gloo on CPU); one rank throttled for real
(SIGSTOP/SIGCONT duty cycle, stopped 80 ms of every ~85 ms: a node at a fraction of its speed) is flagged as slow, and only it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.health import preflight

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
NODES = ["node1", "node2", "node3"]
SLOW = "node3"


# The duty cycle runs in its own process at a real-time priority: when the machine is loaded, a throttler that
# waits for the CPU like everyone else lets the "slow" worker run freely for whole time slices (a CI run on 2
# busy cores once found no node slow). SCHED_FIFO needs root; without it the process runs at normal priority.
_DUTY_CYCLE = """
import os, signal, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
except (OSError, AttributeError):
    pass
pid = int(sys.argv[1])
try:
    while True:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.08)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
except ProcessLookupError:
    pass
"""


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
    if pid is None:
        return
    try:  # held from the moment it is found: the duty cycle's process takes a while to start on a loaded machine
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    cycle = subprocess.Popen([sys.executable, "-c", _DUTY_CYCLE, str(pid)])
    try:
        while not stop.is_set() and cycle.poll() is None:
            stop.wait(0.1)
    finally:
        cycle.kill()
        cycle.wait()
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
