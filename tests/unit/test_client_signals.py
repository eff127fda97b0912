"""Signals in real processes: SIGTERM is recorded in the slot while the program keeps its own
SIGTERM behaviour (default death, its own handler, ignore, or the opt-in graceful stop), and the
agent's stack-dump signal writes every thread's stack even when the rank is stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.client import slot as S

PRELUDE = "import os, signal, sys, threading, time\nfrom supervisor import client\n"

BEAT_UNTIL_STOP = """
i = 0
while not client.should_stop():
    client.step(i)
    i += 1
    time.sleep(0.001)
with client.phase("checkpoint"):
    pass
print("stopped at", i, flush=True)
"""


@pytest.fixture
def slot_dir(tmp_path: Path) -> Path:
    d = tmp_path / "slots"
    d.mkdir(mode=0o700)
    return d


def _spawn(code: str, slot_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "RANK", "SLURM_"))}
    env["SUPERVISOR_SLOT_DIR"] = str(slot_dir)
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for(predicate, what: str, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _beating(slot_dir: Path) -> S.SlotRecord:
    return _wait_for(lambda: (r := S.read_slot(S.slot_path(slot_dir, 0))) and r.beats > 0 and r, "beats")


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_default_sigterm_is_recorded_and_still_kills(slot_dir: Path) -> None:
    proc = _spawn("i = 0\nwhile True:\n    client.step(i)\n    i += 1\n", slot_dir)
    _beating(slot_dir)
    proc.send_signal(signal.SIGTERM)
    code, _, err = _finish(proc)
    assert code == -signal.SIGTERM, err  # the exit status still names the real cause
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_SIGTERM


def test_programs_own_sigterm_handler_still_runs(slot_dir: Path) -> None:
    code = (
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
        "client.step(0)\n"
        "while not got:\n"
        "    client.step(1)\n"
        "    time.sleep(0.001)\n"
        "print('own handler ran; should_stop', client.should_stop(), flush=True)\n"
    )
    proc = _spawn(code, slot_dir)
    _beating(slot_dir)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = _finish(proc)
    assert rc == 0, err
    assert "own handler ran; should_stop True" in out
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_SIGTERM and rec.rank_flags & S.RANK_FLAG_EXITING


TEARDOWN_ABORT = """
class _Destructor:  # a library object whose destructor aborts in the interpreter's teardown (after atexit)
    def __del__(self):
        os.abort()

_lib = _Destructor()
for i in range(3):
    client.step(i)
"""


@pytest.mark.parametrize("raised", [False, True], ids=["ended", "raised"])
def test_a_program_that_ended_says_so_before_a_teardown_abort(slot_dir: Path, raised: bool) -> None:
    """atexit runs before the teardown: a normal end marks ENDED_CLEAN (the abort after it lost no training);
    an unhandled exception does not (the interpreter set sys.last_value before atexit ran)."""
    proc = _spawn("import os\n" + TEARDOWN_ABORT + ("raise RuntimeError('boom')\n" if raised else ""), slot_dir)
    code, _, err = _finish(proc)
    assert code == -signal.SIGABRT, err
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_EXITING
    assert bool(rec.rank_flags & S.RANK_FLAG_ENDED_CLEAN) is not raised


def test_ignored_sigterm_stays_ignored_and_stop_request_ends_the_loop(slot_dir: Path) -> None:
    proc = _spawn("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + BEAT_UNTIL_STOP, slot_dir)
    _beating(slot_dir)
    proc.send_signal(signal.SIGTERM)
    _wait_for(lambda: S.read_slot(S.slot_path(slot_dir, 0)).rank_flags & S.RANK_FLAG_SIGTERM, "flag")  # type: ignore[union-attr]
    # Ignored means ignored; should_stop() reports the SIGTERM, so the loop above ends by itself.
    rc, out, err = _finish(proc)
    assert rc == 0 and "stopped at" in out, err


def test_stop_request_from_the_agent_reaches_a_running_rank(slot_dir: Path) -> None:
    proc = _spawn(BEAT_UNTIL_STOP, slot_dir)
    _beating(slot_dir)
    with S.open_slot_for_reading(S.slot_path(slot_dir, 0)) as reader:
        assert reader.set_control_flags(S.FLAG_STOP)
        rc, out, err = _finish(proc)
        rec = reader.read()
    assert rc == 0 and "stopped at" in out, err
    assert rec is not None and rec.acked_request == 1 and rec.rank_flags & S.RANK_FLAG_EXITING
    assert not rec.rank_flags & S.RANK_FLAG_SIGTERM


def test_deferred_sigterm_lets_the_loop_checkpoint_and_exit(slot_dir: Path) -> None:
    proc = _spawn("client.defer_sigterm()\n" + BEAT_UNTIL_STOP, slot_dir)
    _beating(slot_dir)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = _finish(proc)
    assert rc == 0 and "stopped at" in out, err
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_SIGTERM and rec.last_ckpt_step >= 0


STUCK = """
def stuck_in_python_loop():
    x = 0
    while True:
        x += 1

def stuck_in_sleep():
    time.sleep(600)

threading.Thread(target=stuck_in_sleep, daemon=True).start()
client.step(0)
stuck_in_python_loop() if sys.argv[1:] == ["loop"] else stuck_in_sleep()
"""


@pytest.mark.parametrize("where", ["loop", "sleep"])
def test_stack_dump_on_request_shows_every_thread(slot_dir: Path, where: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "RANK", "SLURM_"))}
    env["SUPERVISOR_SLOT_DIR"] = str(slot_dir)
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + STUCK, where], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        rec = _beating(slot_dir)
        assert rec.rank_flags & S.RANK_FLAG_STACK_DUMPS  # the agent checks this before signalling
        stacks = S.stacks_path(slot_dir, 0)
        assert oct(os.stat(stacks).st_mode & 0o777) == "0o600"
        time.sleep(0.2)  # let the main thread reach the stuck function
        os.kill(proc.pid, S.STACK_DUMP_SIGNAL)
        main_fn = "stuck_in_python_loop" if where == "loop" else "stuck_in_sleep"
        want = 1 if where == "loop" else 2  # the worker thread always sleeps; main does too
        text = _wait_for(
            lambda: (t := stacks.read_text()).count("stuck_in_sleep") >= want and main_fn in t and t,
            "stack dump of both threads",
        )
        assert "Thread 0x" in text and "most recent call first" in text
        assert proc.poll() is None  # a dump does not disturb the rank
    finally:
        proc.kill()
        proc.communicate(timeout=30)
