"""Ranks that never call the client are found from /proc and watched through their process state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from supervisor.agent.discover import find_ranks
from supervisor.agent.sampler import RankSlots
from supervisor.heartbeat import wire


def _task(job: str, node: str, procid: int, step: str = "1", **extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": node, "SLURM_PROCID": str(procid),
           "SLURM_STEP_ID": step, **extra}  # fmt: skip
    # a rank with a child (like a data-loader worker): only the rank itself is taken
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(15)']); time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def test_slotless_ranks_are_found_and_their_stop_is_seen(tmp_path):
    job = f"9{os.getpid()}"
    procs = [_task(job, "nodeA", 0), _task(job, "nodeA", 1), _task(job, "nodeB", 2), _task(job, "nodeA", 5, step="0"),
             _task(job, "nodeA", 3, step="2", SUPERVISOR_HELPER_STEP="preflight")]  # the supervisor's own step
    try:
        deadline = time.monotonic() + 20
        found: dict[int, int] = {}
        while time.monotonic() < deadline:
            found = find_ranks(job, "nodeA", own_step="0")
            if len(found) == 2:
                break
            time.sleep(0.2)
        # not nodeB's, not the agents' own step nor the preflight's, no children
        assert found == {0: procs[0].pid, 1: procs[1].pid}
        slots = RankSlots(tmp_path)
        slots.adopt(found)
        os.kill(procs[1].pid, signal.SIGSTOP)
        deadline = time.monotonic() + 20  # the stop takes effect when the process is next scheduled (loaded CI)
        entries = {e.rank: e for e in slots.sample()}
        while entries[1].state != wire.ST_STOPPED and time.monotonic() < deadline:
            time.sleep(0.1)
            entries = {e.rank: e for e in slots.sample()}
        assert entries[1].state == wire.ST_STOPPED and entries[1].beat_age_ms == wire.NO_BEAT
        assert entries[0].state in (wire.ST_SLEEPING, wire.ST_RUNNING)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait()
        assert {e.rank: e for e in slots.sample()}[1].state == wire.ST_GONE
    finally:
        for p in procs:
            p.kill()
            p.wait()
