"""Step-time statistics the detectors rely on, driven by a scripted clock: the slot keeps exactly
the step times between its last RING marks, the EWMA follows the documented integer recurrence over them, and
checkpoint/eval time is not counted as step time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import slot as S


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(time, "monotonic_ns", c)
    yield c


def _expected(dts: list[int]) -> tuple[int, int, int]:
    recent = dts[-(S.RING - 1) :]  # RING marks give RING - 1 step times
    ewma = recent[0]
    for dt in recent[1:]:
        ewma += (dt - ewma) >> 3
    return ewma, min(recent), max(recent)


@settings(max_examples=40, deadline=None)
@given(dts=st.lists(st.integers(min_value=1, max_value=10**12), min_size=1, max_size=300))
def test_ewma_and_window_min_max(tmp_path_factory: pytest.TempPathFactory, dts: list[int]) -> None:
    c = Clock()
    real = time.monotonic_ns
    time.monotonic_ns = c  # type: ignore[assignment]  # the writer binds the clock when created
    try:
        d = tmp_path_factory.mktemp("slots")
        w = S.SlotWriter.create(d, 0, 0, 1)
    finally:
        time.monotonic_ns = real  # type: ignore[assignment]
    w.beat(0, None)
    for i, dt in enumerate(dts, start=1):
        c.now += dt
        w.beat(i, None)
    rec = S.read_slot(S.slot_path(d, 0))
    assert rec is not None
    assert rec.recent_iter_ns == tuple(dts[-(S.RING - 1) :])
    assert (rec.iter_ewma_ns, rec.iter_min_ns, rec.iter_max_ns) == _expected(dts)
    assert rec.t_last_beat_ns == c.now
    w.close()


def test_other_phases_are_excluded_from_step_time(tmp_path: Path, clock: Clock) -> None:
    w = S.SlotWriter.create(tmp_path, 0, 0, 1)
    w.beat(0, None)
    clock.now += 100
    w.beat(1, None)
    clock.now += 10
    prev = w.enter_phase(S.PHASE_CHECKPOINT)
    clock.now += 1_000_000  # a long checkpoint
    w.exit_phase(S.PHASE_CHECKPOINT, prev, True)
    clock.now += 120
    w.beat(2, None)
    rec = S.read_slot(S.slot_path(tmp_path, 0))
    assert rec is not None
    assert rec.recent_iter_ns == (100, 120)
    assert rec.last_ckpt_step == 1
    w.close()


def test_first_step_ends_init_and_gives_no_step_time(tmp_path: Path, clock: Clock) -> None:
    w = S.SlotWriter.create(tmp_path, 0, 0, 1)
    clock.now += 5_000_000_000  # slow start-up is not an iteration
    w.beat(0, None)
    rec = S.read_slot(S.slot_path(tmp_path, 0))
    assert rec is not None
    assert rec.phase_name == "step" and rec.t_phase_ns == clock.now
    assert rec.recent_iter_ns == () and rec.iter_ewma_ns == rec.iter_max_ns == 0
    w.close()
