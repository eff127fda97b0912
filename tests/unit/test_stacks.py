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

from supervisor.agent.stacks import StackDumps, find_pyspy, process_state, send_checked
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


def test_an_exiting_rank_is_never_signalled(tmp_path: Path, rank_process) -> None:
    """Its atexit ran: a finalizing interpreter has reset its handlers, so the dump signal would kill it."""
    from supervisor.client.slot import RANK_FLAG_EXITING

    dumps = StackDumps(tmp_path, tmp_path / "stacks", "n1", pyspy=None)
    event = dumps.request(0, _record(rank_process.pid, RANK_FLAG_STACK_DUMPS | RANK_FLAG_EXITING, time.time()))
    assert event is not None and event.kind == wire.EVENT_STACKS_FAILED and "exiting" in event.text
    time.sleep(0.2)
    assert rank_process.poll() is None and not dumps.busy


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
    """The last word per node and rank wins: a later saved dump clears an earlier failure (the journal's fold)."""
    from supervisor.decisions import campaign_state
    from supervisor.decisions import events as ev

    events = [
        ev.step_launched(1.0, 1, ["n1", "n2"]),
        {"type": "stacks", "t": 1.5, "node": "n1", "rank": 0, "result": "stacks_failed", "detail": "no dump within 3 s"},
        {"type": "stacks", "t": 1.5, "node": "n1", "rank": 0, "result": "stacks_saved", "detail": "/c/stacks/a.txt"},
        {"type": "stacks", "t": 1.5, "node": "n2", "rank": 5, "result": "stacks_failed", "detail": "no stack: pid 9 is gone"},
        {"type": "action", "t": 1.6, "kind": "kill_step"},
    ]
    stacks = campaign_state.fold(events).report(2.0)["attempts"][0]["stacks"]
    assert stacks["without_stack"] == [{"node": "n2", "rank": 5, "why": "no stack: pid 9 is gone"}]
    assert stacks["saved"] == [{"node": "n1", "rank": 0, "path": "/c/stacks/a.txt"}]


@needs_pyspy
def test_the_agent_dumps_a_rank_without_the_client_from_its_discovered_pid(tmp_path: Path, rank_process) -> None:
    """A rank found only through /proc (it never calls the client) gets py-spy through the agent's command."""
    from supervisor.agent.main import Agent

    key = wire.derive_key(b"s" * 32)
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    agent = Agent(job="9", node="n1", key=key, supervisor=("127.0.0.1", 9), slot_dir=slots, campaign=tmp_path,
                  keep_slot_dir=True)  # fmt: skip
    try:
        agent.slots.adopt({3: rank_process.pid})
        frame = wire.encode_control(key, instance=1, seq=1, wall_ns=time.time_ns(), mono_ns=1, job="9", node="n1",
                                    commands=[wire.Command(wire.CMD_DUMP_STACKS)])  # fmt: skip
        sent: list[wire.Event] = []
        agent.send_events = sent.extend  # type: ignore[method-assign]
        agent.handle(frame)
        sent += _finish(agent.stacks)
        (event,) = sent
        assert event.kind == wire.EVENT_STACKS_SAVED and event.rank == 3, event.text
        assert "stuck_in_collective" in Path(event.text).read_text()
    finally:
        agent.close()


def test_the_report_says_which_ranks_of_a_launch_have_no_stack_and_why() -> None:
    from supervisor import report_view
    from supervisor.decisions import events as ev

    journal = [
        ev.campaign_started(0.0, "/c", ["python"]), ev.attempt_started(1.0, "9", 0, ["n1", "n2"], None),
        ev.step_launched(2.0, 1, ["n1", "n2"]), ev.interruption_event(50.0, ev.HANG, ["n2"], 0.9, ["rank 1 hung"]),
        ev.stacks(51.0, "n1", 0, "stacks_saved", "/c/stacks/n1-rank0.txt"),
        ev.stacks(52.0, "n2", 1, "stacks_failed", "no answer from the node's agent within 22 s"),
    ]  # fmt: skip
    doc = report_view.fold(journal, now=60.0)
    stacks = doc["attempts"][0]["stacks"]
    assert stacks == {"saved": [{"node": "n1", "rank": 0, "path": "/c/stacks/n1-rank0.txt"}],
                      "without_stack": [{"node": "n2", "rank": 1,
                                         "why": "no answer from the node's agent within 22 s"}]}  # fmt: skip
    text = report_view.render_text(doc)
    assert "launch 1: no stack for rank 1 on n2: no answer from the node's agent within 22 s" in text
    assert "launch 1: 1 stack dump(s) saved before the kill" in text
