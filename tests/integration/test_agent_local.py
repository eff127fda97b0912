"""The node agent against real rank processes on this host (no Slurm): states, restarts, stack dumps,
control flags, and the agent leaving when the supervisor goes away."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.client.slot import FLAG_CHECKPOINT
from supervisor.heartbeat import wire
from supervisor.heartbeat.server import AggregatorServer
from supervisor.heartbeat.table import RankView

RANK_SCRIPT = """
import sys, time
from supervisor import client
period = float(sys.argv[1])
i = 0
while True:
    client.step(i, loss=1.0 / (i + 1))
    i += 1
    time.sleep(period)
"""

JOB = "4242"


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.campaign = tmp / "campaign"
        self.slots = tmp / "slots"
        self.server = AggregatorServer(self.campaign, JOB, rate_window_s=1.0, keepalive_interval_s=0.5,
                                       live_interval_s=0.2)
        self.server.write_address_file()  # the agents read this run's channel value there
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve, args=(self.stop, 0.05), daemon=True)
        self.thread.start()
        self.script = tmp / "rank.py"
        self.script.write_text(RANK_SCRIPT)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_agent(self, *extra: str) -> subprocess.Popen[bytes]:
        host, port = self.server.address
        p = subprocess.Popen([sys.executable, "-m", "supervisor.agent", "--campaign", str(self.campaign),
                              "--supervisor", f"{host}:{port}", "--job-id", JOB, "--node", "nodeX",
                              "--slot-dir", str(self.slots), "--sample-interval", "0.1", "--report-interval", "0.3",
                              "--supervisor-timeout", "4", *extra], stderr=subprocess.PIPE)
        self.procs.append(p)
        return p

    def start_rank(self, rank: int, period: float = 0.05) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SUPERVISOR_SLOT_DIR": str(self.slots), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "2"}
        p = subprocess.Popen([sys.executable, str(self.script), str(period)], env=env)
        self.procs.append(p)
        return p

    def ranks(self) -> dict[int, RankView]:
        return {r.rank: r for r in self.server.table.rank_views()}

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; ranks={self.ranks()}")

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()
        self.stop.set()
        self.thread.join()
        self.server.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


def test_agent_follows_ranks_through_stop_kill_restart_dumps_and_flags(harness: Harness) -> None:
    h = harness
    h.slots.mkdir(mode=0o700)
    r0, r1 = h.start_rank(0), h.start_rank(1)
    agent = h.start_agent()
    h.wait_for("both ranks stepping", lambda: all(
        (v := h.ranks().get(r)) is not None and v.state in ("running", "sleeping") and (v.steps_per_s or 0) > 5
        for r in (0, 1)))
    assert h.ranks()[0].pid == r0.pid and h.ranks()[1].pid == r1.pid
    assert h.ranks()[0].phase == "step" and h.ranks()[0].beat_age_s is not None and h.ranks()[0].beat_age_s < 1.0

    os.kill(r1.pid, signal.SIGSTOP)
    h.wait_for("rank 1 stopped", lambda: h.ranks()[1].state == "stopped")
    h.wait_for("rank 1 beat ageing", lambda: (h.ranks()[1].beat_age_s or 0) > 1.5)
    assert h.ranks()[0].beat_age_s < 1.0  # the other rank is unaffected
    os.kill(r1.pid, signal.SIGCONT)
    h.wait_for("rank 1 running again", lambda: h.ranks()[1].state in ("running", "sleeping")
               and h.ranks()[1].beat_age_s < 1.0)

    assert h.server.send("nodeX", [wire.Command(wire.CMD_DUMP_STACKS, 0)])
    h.wait_for("a saved stack dump", lambda: any(e["event"] == "stacks_saved" for e in h.server.table.events))
    ev = next(e for e in h.server.table.events if e["event"] == "stacks_saved")
    dump = Path(ev["text"])
    assert ev["rank"] == 0 and dump.parent == h.campaign / "stacks"
    assert "rank.py\", line" in dump.read_text()  # faulthandler frames of the rank's main loop
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600

    assert h.server.send("nodeX", [wire.Command(wire.CMD_SET_FLAGS, 1, wire.flags_arg(FLAG_CHECKPOINT))])
    h.wait_for("checkpoint flag visible", lambda: h.ranks()[1].control_flags == FLAG_CHECKPOINT)
    assert h.ranks()[0].control_flags == 0

    r1.kill()
    r1.wait()
    h.wait_for("rank 1 gone", lambda: h.ranks()[1].state == "gone")
    r1b = h.start_rank(1)
    h.wait_for("rank 1 back with a new pid", lambda: h.ranks()[1].pid == r1b.pid
               and h.ranks()[1].state in ("running", "sleeping"))

    assert h.server.table.counters.get("ok", 0) > 5
    assert not any(k.startswith("rejected") for k in h.server.table.counters)
    assert agent.poll() is None

    # The supervisor goes away: the agent notices, exits cleanly and removes the slot directory.
    h.stop.set()
    h.thread.join()
    h.server.close()
    t0 = time.monotonic()
    _, err = agent.communicate(timeout=15)
    assert agent.returncode == 0, err
    assert time.monotonic() - t0 < 10
    assert b"exiting" in err
    assert not h.slots.exists()


def test_agent_ignores_a_supervisor_without_the_secret_and_leaves(harness: Harness, tmp_path: Path) -> None:
    h = harness
    impostor = AggregatorServer(tmp_path / "other", JOB, keepalive_interval_s=0.2)  # its own secret
    stop = threading.Event()
    t = threading.Thread(target=impostor.serve, args=(stop, 0.05), daemon=True)
    t.start()
    try:
        host, port = impostor.address
        p = subprocess.Popen([sys.executable, "-m", "supervisor.agent", "--campaign", str(h.campaign),
                              "--supervisor", f"{host}:{port}", "--job-id", JOB, "--node", "nodeY",
                              "--slot-dir", str(h.slots), "--supervisor-timeout", "2"], stderr=subprocess.PIPE)
        _, err = p.communicate(timeout=20)
        assert p.returncode == 0
        assert b"no word from the supervisor" in err
        assert impostor.table.counters["rejected_mac"] >= 1 and impostor.table.nodes == {}
    finally:
        stop.set()
        t.join()
        impostor.close()


def test_agent_refuses_a_world_readable_secret_with_one_clear_line(tmp_path: Path) -> None:
    camp = tmp_path / "c"
    camp.mkdir()
    (camp / "secret").write_text("ab" * 32)
    os.chmod(camp / "secret", 0o644)
    p = subprocess.run([sys.executable, "-m", "supervisor.agent", "--campaign", str(camp), "--supervisor",
                        "127.0.0.1:9", "--job-id", "1", "--slot-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 3
    assert p.stderr.count("\n") == 1 and "chmod 600" in p.stderr


def test_agent_exits_when_its_watched_parent_pid_is_gone(harness: Harness) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        agent = harness.start_agent("--parent-pid", str(parent.pid), "--supervisor-timeout", "60")
        harness.wait_for("the agent reporting", lambda: "nodeX" in harness.server.table.nodes)
        assert agent.poll() is None
    finally:
        parent.kill()
        parent.wait()
    _, err = agent.communicate(timeout=20)
    assert agent.returncode == 0 and f"watched pid {parent.pid} is gone".encode() in err
