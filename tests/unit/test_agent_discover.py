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
    # first (the lower pid, which a rank found twice keeps): 26.05's batch script, SLURM_STEP_ID=-5 and SLURM_PROCID=0
    batch = _task(job, "nodeA", 0, step="-5")
    procs = [_task(job, "nodeA", 0), _task(job, "nodeA", 1), _task(job, "nodeB", 2), _task(job, "nodeA", 5, step="0"),
             _task(job, "nodeA", 3, step="2", SUPERVISOR_HELPER_STEP="preflight"), batch]  # preflight: the supervisor's
    try:
        deadline = time.monotonic() + 20
        found: dict[int, int] = {}
        while time.monotonic() < deadline:
            found = find_ranks(job, "nodeA", own_step="0")
            if len(found) == 2:
                break
            time.sleep(0.2)
        # not nodeB's, not the agents' own step nor the preflight's nor the batch script, no children
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
        assert entries[0].state in (wire.ST_SLEEPING, wire.ST_RUNNING, wire.ST_DISK)  # D: alive, in I/O (loaded CI)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait()
        assert {e.rank: e for e in slots.sample()}[1].state == wire.ST_GONE
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_torchrun_workers_are_the_ranks_keyed_by_their_global_rank_and_torchrun_is_not(tmp_path):
    """`srun torchrun`: the srun task (SLURM_PROCID = node index) is torchrun; its workers carry RANK and
    TORCHELASTIC_RUN_ID; a worker's own child (a data loader) is not a rank."""
    job = f"8{os.getpid()}"
    worker = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']);"
              " time.sleep(60)")
    launcher = tmp_path / "torchrun"  # named like torchrun's script: a launcher even before its workers start
    launcher.write_text(
        "import os, subprocess, sys, time\n"
        f"code = {worker!r}\n"
        "if sys.argv[1:] == ['spawn']:\n"
        "    for r in (2, 3):\n"
        "        subprocess.Popen([sys.executable, '-c', code],\n"
        "                         env={**os.environ, 'RANK': str(r), 'TORCHELASTIC_RUN_ID': 'x'})\n"
        "time.sleep(60)\n")  # fmt: skip
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": "nodeB", "SLURM_PROCID": "1", "SLURM_STEP_ID": "1",
           "RANK": "1"}  # fmt: skip
    env.pop("TORCHELASTIC_RUN_ID", None)
    procs = [subprocess.Popen([sys.executable, str(launcher), "spawn"], env=env)]
    waiting = {**env, "SLURMD_NODENAME": "nodeC"}  # a torchrun still in its rendezvous: no workers yet
    procs.append(subprocess.Popen([sys.executable, str(launcher)], env=waiting))
    try:
        import psutil

        deadline = time.monotonic() + 60
        while len(psutil.Process(procs[0].pid).children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)  # both workers and their own children are up: the case that matters
        found = find_ranks(job, "nodeB", own_step="0")
        assert sorted(found) == [2, 3]
        assert all(_ppid(pid) == procs[0].pid for pid in found.values())  # the workers, not their children
        assert find_ranks(job, "nodeC", own_step="0") == {}
    finally:
        for p in procs:
            kill_tree(p.pid)
            p.wait()


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[1])


def kill_tree(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        for child in proc.children(recursive=True):
            child.kill()
        proc.kill()
    except psutil.NoSuchProcess:
        pass
