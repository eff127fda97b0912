"""Agents as an overlapping srun step on the real local Slurm: a 2-node x 2-rank job whose ranks call
``client.step``; live per-rank rates in ``supervise status --json``; SIGSTOP / SIGKILL of a rank seen;
agents leave (and clean their slot dirs) when the supervisor goes away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.heartbeat.server import AggregatorServer
from supervisor.heartbeat.table import RankView

pytestmark = pytest.mark.slurm

# Several slurmd share this host's /dev/shm, so the slot dir carries the node name (see docs/heartbeat-path.md).
SLOT_TEMPLATE = "/dev/shm/supervisor-{job}-{uid}-{node}"

RANK_SCRIPT = """
import time
from supervisor import client
i = 0
while True:
    client.step(i, loss=1.0 / (i + 1))
    i += 1
    time.sleep(0.05)
"""

BATCH = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --time=5 --job-name=agent-test --output={campaign}/job-%j.out
# Agents and ranks fill in {{node}}, {{job}} and {{uid}} the same way.
export SUPERVISOR_SLOT_DIR='{slots}'
srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 {py} -m supervisor.agent --campaign {campaign} \\
    --supervisor {addr} --sample-interval 0.1 --report-interval 0.3 --supervisor-timeout 5 &
# Like the supervisor: launch training once every node's agent has reported (its slot dir then exists).
while [ ! -e {campaign}/agents-ready ]; do sleep 0.1; done
srun --overlap --nodes=2 --ntasks=4 --ntasks-per-node=2 {py} {rank_script} &
wait
"""


def _wait(what: str, pred: Callable[[], bool], timeout: float, show: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {show()}")


def test_two_nodes_two_ranks_live_status_stop_kill_and_agent_exit(tmp_path: Path) -> None:
    campaign = tmp_path / "campaign"
    server = AggregatorServer(campaign, job="pending", rate_window_s=1.0, keepalive_interval_s=0.5,
                              live_interval_s=0.3)
    server.write_address_file()  # the agents read this run's channel value there
    stop = threading.Event()
    thread: threading.Thread | None = None
    job = ""
    try:
        rank_script = tmp_path / "rank.py"
        rank_script.write_text(RANK_SCRIPT)
        host, port = server.address
        batch = tmp_path / "job.sh"
        batch.write_text(BATCH.format(campaign=campaign, py=sys.executable, addr=f"{host}:{port}",
                                      slots=SLOT_TEMPLATE, rank_script=rank_script))
        out = subprocess.run(["sbatch", "--parsable", str(batch)], capture_output=True, text=True, timeout=30,
                             check=True, cwd=tmp_path)
        job = out.stdout.strip().split(";")[0]
        server.job = server.table.job = job  # frames must carry this job id
        thread = threading.Thread(target=server.serve, args=(stop, 0.05), daemon=True)
        thread.start()

        def ranks() -> dict[int, RankView]:
            return {r.rank: r for r in server.table.rank_views()}

        def log() -> str:
            logs = list(campaign.glob("job-*.out"))
            return f"ranks={ranks()} counters={dict(server.table.counters)} log={logs[0].read_text()[-2000:] if logs else ''}"

        _wait("both agents reporting", lambda: len(server.table.nodes) == 2, 60, log)
        (campaign / "agents-ready").touch()
        _wait("4 ranks on 2 nodes stepping", lambda: len(ranks()) == 4 and all(
            (r.steps_per_s or 0) > 2 for r in ranks().values()), 90, log)
        nodes = {r.node for r in ranks().values()}
        assert len(nodes) == 2 and all(n.startswith("node") for n in nodes)
        assert sorted(r.rank for r in ranks().values()) == [0, 1, 2, 3]

        # The "done means" of the heartbeat path: `supervise status --json` shows live per-rank step rates.
        # live.json is rewritten about once a second, in slices: poll until it shows every rank's rate.
        def status_doc() -> dict | None:
            st = subprocess.run([sys.executable, "-m", "supervisor.cli", "status", str(campaign), "--json"],
                                capture_output=True, text=True, timeout=60)
            assert st.returncode == 0, st.stderr
            got = json.loads(st.stdout)
            return got if len(got["ranks"]) == 4 and all(r["steps_per_s"] for r in got["ranks"]) else None

        doc: dict = {}
        _wait("status --json to show 4 step rates", lambda: doc.update(status_doc() or {}) or bool(doc), 30, log)
        assert doc["job"] == job and len(doc["nodes"]) == 2
        assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3]
        for r in doc["ranks"]:
            assert r["steps_per_s"] is not None and 2 < r["steps_per_s"] < 40, r
            assert r["state"] in ("running", "sleeping") and r["beat_age_s"] < 2, r
        table = subprocess.run([sys.executable, "-m", "supervisor.cli", "status", str(campaign)],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0 and f"job {job}" in table.stdout

        victim = ranks()[1]
        os.kill(victim.pid, signal.SIGSTOP)
        _wait("rank 1 stopped with an ageing beat", lambda: ranks()[1].state == "stopped"
              and (ranks()[1].beat_age_s or 0) > 1.5, 20, log)
        assert all(r.beat_age_s < 2 for k, r in ranks().items() if k != 1)
        os.kill(victim.pid, signal.SIGKILL)
        _wait("rank 1 gone", lambda: ranks()[1].state == "gone", 20, log)

        # The supervisor goes away: both agents exit on their own and remove their slot dirs.
        slot_dirs = [Path(SLOT_TEMPLATE.format(job=job, uid=os.getuid(), node=n)) for n in nodes]
        assert all(d.is_dir() for d in slot_dirs)
        stop.set()
        thread.join()
        server.close()

        def agent_step_running() -> bool:
            q = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True,
                               timeout=30)
            return f"{job}.0" in q.stdout.split()

        _wait("the agents' step to end", lambda: not agent_step_running(), 30, log)
        assert not any(d.exists() for d in slot_dirs)
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        server.close()
        if job:
            subprocess.run(["scancel", job], timeout=30, check=False)
