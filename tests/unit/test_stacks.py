"""Stacks of the ranks that need them most, from real processes: a stopped rank (py-spy --nonblocking, left
stopped), a rank without the client (py-spy --native), and no signal ever reaching a recycled pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.agent.stacks import StackDumps, find_pyspy, process_state, send_checked, without_stack
from supervisor.client.layout import SlotRecord
from supervisor.client.slot import RANK_FLAG_STACK_DUMPS
from supervisor.heartbeat import wire

PROGRAM = """
import sys, time
def stuck_in_collective():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
stuck_in_collective()
"""

needs_pyspy = pytest.mark.skipif(find_pyspy() is None, reason="py-spy (the stacks extra) is not installed")


@pytest.fixture
def rank_process():
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def _record(pid: int, flags: int, start_wall: float) -> SlotRecord:
    return SlotRecord(pid=pid, rank=0, local_rank=0, world_size=1, start_mono_ns=1, start_wall_ns=int(start_wall * 1e9),
                      step=5, t_last_beat_ns=1, loss=float("nan"), loss_step=-1, beats=5, t_phase_ns=1,
                      last_ckpt_step=-1, phase=1, rank_flags=flags, acked_request=0, seq=2)  # fmt: skip


def _finish(dumps: StackDumps, timeout_s: float = 60.0) -> list[wire.Event]:
    deadline = time.monotonic() + timeout_s
    events: list[wire.Event] = []
    while dumps.busy and time.monotonic() < deadline:
        events += dumps.poll()
        time.sleep(0.05)
    return events


@needs_pyspy
def test_a_stopped_rank_gets_a_python_stack_and_stays_stopped(tmp_path: Path, rank_process) -> None:
    pid = rank_process.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while process_state(pid) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.01)
    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1")
    assert dumps.request(0, _record(pid, RANK_FLAG_STACK_DUMPS, time.time())) is None  # not signalled: py-spy
    (event,) = _finish(dumps)
    assert event.kind == wire.EVENT_STACKS_SAVED, event.text
    text = Path(event.text).read_text()
    assert "stuck_in_collective" in text and "native frames unavailable: the process is stopped" in text
    assert oct(Path(event.text).stat().st_mode & 0o777) == "0o600"
    assert process_state(pid) == "stopped"  # never resumed by the dump


@needs_pyspy
def test_a_rank_without_the_client_gets_native_frames(tmp_path: Path, rank_process) -> None:
    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1")
    assert dumps.request(2, None, pid=rank_process.pid, started_by=time.time()) is None
    (event,) = _finish(dumps)
    assert event.kind == wire.EVENT_STACKS_SAVED and event.rank == 2, event.text
    text = Path(event.text).read_text()
    assert "stuck_in_collective" in text
    assert "(mode native)" in text or "(mode nonblocking)" in text  # native unless ptrace is refused here
    assert rank_process.poll() is None


def test_a_recycled_pid_is_never_signalled(tmp_path: Path, rank_process) -> None:
    """The rank's slot says it started an hour before the process now holding its pid: the dump signal (whose
    default action kills) must not be sent."""
    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1", pyspy=None)
    event = dumps.request(0, _record(rank_process.pid, RANK_FLAG_STACK_DUMPS, time.time() - 3600))
    assert event is not None and event.kind == wire.EVENT_STACKS_FAILED and "recycled" in event.text
    assert send_checked(rank_process.pid, signal.SIGTERM, time.time() - 3600) is not None
    assert rank_process.poll() is None and dumps.busy is False
    assert send_checked(rank_process.pid, signal.SIGTERM, time.time()) is None  # the same process: delivered
    assert rank_process.wait(30) == -signal.SIGTERM


def test_no_stack_and_why_without_pyspy(tmp_path: Path, rank_process) -> None:
    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1", pyspy=None)
    event = dumps.request(1, None, pid=rank_process.pid)
    assert event is not None and "does not use the client" in event.text and "py-spy is not installed" in event.text
    rank_process.kill()
    rank_process.wait()
    gone = dumps.request(1, None, pid=rank_process.pid)
    assert gone is not None and "exited" in gone.text


def test_a_failing_pyspy_is_reported_not_raised(tmp_path: Path, rank_process) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 1)' >&2\nexit 1\n")
    fake.chmod(0o755)
    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1", pyspy=str(fake))
    assert dumps.request(4, None, pid=rank_process.pid, started_by=time.time()) is None
    (event,) = _finish(dumps)
    assert event.kind == wire.EVENT_STACKS_FAILED
    assert "py-spy --native" in event.text and "py-spy --nonblocking" in event.text and "ptrace" in event.text
    assert list((tmp_path / "stacks").iterdir()) == []  # no empty dump files left behind


def test_ranks_without_a_stack_from_the_journal() -> None:
    events = [
        {"type": "stacks", "node": "n1", "rank": 0, "result": "stacks_failed", "detail": "no dump within 3 s"},
        {"type": "stacks", "node": "n1", "rank": 0, "result": "stacks_saved", "detail": "/c/stacks/a.txt"},
        {"type": "stacks", "node": "n2", "rank": 5, "result": "stacks_failed", "detail": "no stack: pid 9 is gone"},
        {"type": "action", "kind": "kill_step"},
    ]
    assert without_stack(events) == [{"node": "n2", "rank": 5, "why": "no stack: pid 9 is gone"}]
