"""The seqlock under fire: a real writer process hammers records whose fields all derive from one
counter, so any torn snapshot is detectable; the reader must only ever see self-consistent ones.
The same for the supervisor-written control area, read by the rank. The writer also switches
phases from a signal handler at high rate, so a publish is re-entered mid-write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import slot as S

HAMMER_S = 1.5

WRITER = r"""
import json, os, signal, sys, time
from supervisor import client
from supervisor.client import api

deadline = time.monotonic() + float(sys.argv[1])
use_timer = sys.argv[2] == "timer"
switches = 0

def on_alarm(signum, frame):
    global switches
    with client.phase("eval"):  # re-enters the slot writer from inside step()
        switches += 1

if use_timer:
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
client.step(0, 0.0)
w = api._writer
torn_control = control_reads = 0
i = 1
while time.monotonic() < deadline:
    for _ in range(200):
        client.step(i, float(i))
        i += 1
    ctl = w.read_control()
    if ctl is not None and ctl.request:
        control_reads += 1
        if ctl.at_step != ctl.request * 7 or ctl.flags != ctl.request % 3 + 1:
            torn_control += 1
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print(json.dumps({"last": i - 1, "switches": switches, "control_reads": control_reads,
                  "torn_control": torn_control}))
"""


def _consistent(rec: S.SlotRecord) -> bool:
    return rec.loss == float(rec.step) and rec.loss_step == rec.step and rec.beats == rec.step + 1


def _hammer(tmp_path: Path, mode: str) -> None:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    env = dict(os.environ, SUPERVISOR_SLOT_DIR=str(slot_dir), RANK="0")
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(HAMMER_S), mode], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        path = S.slot_path(slot_dir, 0)
        while not path.exists() and child.poll() is None:
            time.sleep(0.001)
        reader = S.open_slot_for_reading(path)
        snapshots = torn = went_back = 0
        last_step = -1
        request = 0
        while child.poll() is None:
            rec = reader.read()
            if rec is None or rec.beats == 0:
                continue
            snapshots += 1
            if not _consistent(rec):
                torn += 1
            if rec.step < last_step:
                went_back += 1
            last_step = rec.step
            if snapshots % 50 == 0:  # the agent side writes control records derived from the counter
                request += 1
                reader.set_control_flags(request % 3 + 1, at_step=request * 7)
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    result = json.loads(out)
    final = reader.read()
    reader.close()
    assert torn == 0 and went_back == 0, (torn, went_back, snapshots)
    assert snapshots > 100  # the reader really raced the writer
    assert final is not None and final.step == result["last"] and final.seq % 2 == 0
    assert result["torn_control"] == 0 and result["control_reads"] > 10, result
    if mode == "timer":
        assert result["switches"] > 10, result  # the re-entrant path really ran


def test_reader_never_sees_a_torn_rank_record(tmp_path: Path) -> None:
    _hammer(tmp_path, "plain")


def test_publish_reentered_from_a_signal_handler_stays_consistent(tmp_path: Path) -> None:
    _hammer(tmp_path, "timer")


def test_threads_reader_and_writer(tmp_path: Path) -> None:
    w = S.SlotWriter.create(tmp_path, 0, 0, 1)
    stop = threading.Event()
    bad: list[S.SlotRecord] = []
    seen = [0]

    def read_loop() -> None:
        reader = S.open_slot_for_reading(S.slot_path(tmp_path, 0))
        while not stop.is_set():
            rec = reader.read()
            if rec is not None and rec.beats:
                seen[0] += 1
                if not _consistent(rec):
                    bad.append(rec)
        reader.close()

    t = threading.Thread(target=read_loop)
    t.start()
    w.beat(0, 0.0)
    deadline = time.monotonic() + 0.5
    i = 1
    while time.monotonic() < deadline:
        w.beat(i, float(i))
        i += 1
    stop.set()
    t.join()
    w.close()
    assert not bad and seen[0] > 0


@settings(max_examples=25, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=-(2**40), max_value=2**40)),
        min_size=1,
        max_size=10,
    )
)
def test_control_area_round_trip(tmp_path_factory, requests: list[tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("slots")
    w = S.SlotWriter.create(d, 0, 0, 1)
    reader = S.open_slot_for_reading(S.slot_path(d, 0))
    expected_request = 0
    for flags, at_step in requests:
        assert reader.set_control_flags(flags, at_step)
        expected_request += 1 if flags else 0
        ctl = w.read_control()
        assert ctl == S.ControlState(flags, expected_request, at_step)
        assert reader.read_control() == ctl
    reader.close()
    w.close()
