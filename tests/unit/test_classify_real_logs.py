"""The classifier against what real torch.distributed (gloo) prints when a peer dies: two real processes,
one killed or crashing, the survivor's real stderr and both real exit codes fed to classify()."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence, LogLine, RankExit, classify

pytestmark = pytest.mark.torch

PEER = """
import datetime, sys, time
import torch
import torch.distributed as dist
rank, port, fail_at = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
t = torch.ones(4)
for i in range(10_000):
    if rank == 1 and i == fail_at:
        raise ValueError(f"bad batch at step {i}")
    dist.all_reduce(t)
    print(f"step={i}", flush=True)
    time.sleep(0.05)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(tmp_path, fail_at: int, kill_rank1: bool):
    pytest.importorskip("torch")
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), port, str(fail_at)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for r in (0, 1)
    ]
    try:
        if kill_rank1:
            assert procs[1].stdout is not None
            for line in procs[1].stdout:  # wait until training really runs
                if line.startswith("step=3"):
                    break
            procs[1].send_signal(signal.SIGKILL)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = tuple(LogLine(line, node=f"node{r + 1}") for r, (_, err) in enumerate(outs) for line in err.splitlines())
    exits = tuple(RankExit(f"node{r + 1}", r, p.returncode, t=time.time()) for r, p in enumerate(procs))
    return logs, exits


def test_a_killed_peer_is_the_root_cause_and_the_survivors_gloo_error_a_comm_error(tmp_path):
    logs, exits = _run_pair(tmp_path, fail_at=-1, kill_rank1=True)
    assert exits[0].exit_code == 1 and exits[1].signal_number() == 9
    result = classify(Evidence(log_lines=logs, rank_exits=exits))
    assert result.cls == ev.UNKNOWN and "SIGKILL" in result.evidence[0] and result.blamed_nodes == ()
    survivor_only = classify(Evidence(log_lines=logs, rank_exits=exits[:1]))
    assert survivor_only.cls == ev.COMM_ERROR, survivor_only.evidence


def test_a_python_exception_on_one_rank_is_an_app_error_not_the_peers_comm_error(tmp_path):
    logs, exits = _run_pair(tmp_path, fail_at=5, kill_rank1=False)
    assert exits[1].exit_code == 1
    result = classify(Evidence(log_lines=logs, rank_exits=exits))
    assert result.cls == ev.APP_ERROR, result.evidence
    assert any("ValueError: bad batch" in line for line in result.evidence)


def test_a_save_on_a_full_filesystem_is_an_app_error_that_says_disk_full():
    """torch.save on a full tmpfs (recorded on this machine): the message never says "No space left"."""
    from supervisor.decisions.classify import Evidence, LogLine, RankExit, classify

    log = ["0: Traceback (most recent call last):",
           "0: RuntimeError: basic_ios::clear: iostream error",
           "0: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534",
           "srun: error: node1: task 0: Exited with exit code 1"]  # fmt: skip
    got = classify(Evidence(log_lines=tuple(LogLine(x) for x in log), task_nodes=("node1", "node2"),
                            allocation_nodes=("node1", "node2"), rank_exits=(RankExit("node1", 0, 1),),
                            job_state="RUNNING"))  # fmt: skip
    assert got.cls == "app_error" and got.blamed_nodes == ()
    assert any("(disk-full)" in line and "node1 rank 0" in line for line in got.evidence), got.evidence
