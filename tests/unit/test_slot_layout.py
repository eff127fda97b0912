"""The slot file as the node agent sees it: every field round-trips, control flags reach the rank,
and a half-created or foreign file reads as "no slot" rather than garbage."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import slot as S


@pytest.fixture
def slot_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "slots"
    d.mkdir(mode=0o700)
    yield d


def test_fresh_slot_reads_back_identity_and_unknowns(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, rank=5, local_rank=1, world_size=8)
    rec = S.read_slot(S.slot_path(slot_dir, 5))
    assert rec is not None
    assert (rec.pid, rec.rank, rec.local_rank, rec.world_size) == (os.getpid(), 5, 1, 8)
    assert rec.step == -1 and rec.beats == 0 and rec.loss_step == -1 and math.isnan(rec.loss)
    assert rec.phase_name == "init" and rec.t_last_beat_ns == 0
    assert rec.iter_ewma_ns == rec.iter_min_ns == rec.iter_max_ns == 0
    assert rec.seq % 2 == 0
    mode = stat.S_IMODE(os.stat(S.slot_path(slot_dir, 5)).st_mode)
    assert mode == 0o600
    assert os.path.getsize(S.slot_path(slot_dir, 5)) == S.SLOT_SIZE
    w.close()


@pytest.mark.parametrize("loss", [1.25, float("nan"), float("inf"), float("-inf"), -0.0, 3])
def test_loss_round_trips_exactly_including_nan_and_inf(slot_dir: Path, loss: float) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    w.beat(7, loss)
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.step == 7 and rec.loss_step == 7
    if math.isnan(loss):
        assert math.isnan(rec.loss)
    else:
        assert rec.loss == loss and math.copysign(1, rec.loss) == math.copysign(1, loss)
    w.beat(8, None)  # no loss this step: the last one is kept, with the step it belongs to
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.step == 8 and rec.loss_step == 7 and rec.beats == 2
    w.close()


def test_beats_phases_and_times(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 2, 0, 4)
    reader = S.open_slot_for_reading(S.slot_path(slot_dir, 2))
    w.beat(0, 1.0)
    first = reader.read()
    assert first is not None and first.phase_name == "step" and first.t_last_beat_ns > 0
    w.beat(1, 1.0)
    prev = w.enter_phase(S.PHASE_CODES["eval"])
    rec = reader.read()
    assert rec is not None and rec.phase_name == "eval" and prev == S.PHASE_STEP
    assert rec.t_phase_ns >= rec.t_last_beat_ns and rec.last_sign_of_life_ns() == rec.t_phase_ns
    w.exit_phase(S.PHASE_CODES["eval"], prev, True)
    rec = reader.read()
    assert rec is not None and rec.phase_name == "step" and rec.beats == 2
    assert rec.iter_ewma_ns > 0 and rec.iter_min_ns == rec.iter_max_ns == rec.iter_ewma_ns
    reader.close()
    w.close()


def test_checkpoint_phase_sets_flag_and_acknowledges(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    reader = S.open_slot_for_reading(S.slot_path(slot_dir, 0))
    w.beat(10, None)
    assert reader.set_control_flags(S.FLAG_CHECKPOINT)
    assert w.should_checkpoint() and not w.should_stop()
    prev = w.enter_phase(S.PHASE_CHECKPOINT)
    rec = reader.read()
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_IN_CHECKPOINT and rec.phase_name == "checkpoint"
    w.exit_phase(S.PHASE_CHECKPOINT, prev, False)  # failed checkpoint: request still pending
    assert w.should_checkpoint()
    prev = w.enter_phase(S.PHASE_CHECKPOINT)
    w.exit_phase(S.PHASE_CHECKPOINT, prev, True)
    assert not w.should_checkpoint()
    rec = reader.read()
    ctl = reader.read_control()
    assert rec is not None and ctl is not None
    assert not rec.rank_flags & S.RANK_FLAG_IN_CHECKPOINT
    assert rec.acked_request == ctl.request == 1 and rec.last_ckpt_step == 10
    reader.set_control_flags(S.FLAG_CHECKPOINT)  # a new request after the ack
    assert w.should_checkpoint()
    reader.close()
    w.close()


def test_at_step_makes_ranks_agree_on_the_checkpoint_step(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    reader = S.open_slot_for_reading(S.slot_path(slot_dir, 0))
    w.beat(3, None)
    reader.set_control_flags(S.FLAG_STOP, at_step=5)
    assert not w.should_checkpoint() and not w.should_stop()
    w.beat(4, None)
    assert not w.should_checkpoint()
    w.beat(5, None)
    assert w.should_checkpoint() and w.should_stop()
    prev = w.enter_phase(S.PHASE_CHECKPOINT)
    w.exit_phase(S.PHASE_CHECKPOINT, prev, True)
    assert not w.should_checkpoint() and w.should_stop()  # stop stays asked after the checkpoint
    reader.set_control_flags(0)  # withdrawn
    assert not w.should_stop()
    reader.close()
    w.close()


def test_restarted_rank_ignores_requests_older_than_itself(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    reader = S.open_slot_for_reading(S.slot_path(slot_dir, 0))
    reader.set_control_flags(S.FLAG_STOP)
    assert w.should_stop()
    old_seq = reader.read().seq  # type: ignore[union-attr]
    w.close()
    w2 = S.SlotWriter.create(slot_dir, 0, 0, 1)  # same file, next incarnation
    assert not w2.should_stop() and not w2.should_checkpoint()
    rec = reader.read()  # the agent's old mapping sees the new incarnation
    assert rec is not None and rec.seq > old_seq and rec.beats == 0
    reader.set_control_flags(S.FLAG_STOP)
    assert w2.should_stop()
    reader.close()
    w2.close()


def test_async_flags_are_visible_without_a_publish(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    w.set_async_flag(S.RANK_FLAG_SIGTERM)
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_SIGTERM
    assert w.should_stop()
    w.close()


def test_reader_waits_for_a_file_not_yet_sized(slot_dir: Path) -> None:
    path = S.slot_path(slot_dir, 0)
    path.touch(mode=0o600)
    reader = S.open_slot_for_reading(path)
    assert reader.read() is None and reader.read_control() is None
    assert not reader.set_control_flags(S.FLAG_STOP)
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    assert reader.read() is not None
    reader.close()
    w.close()


def test_bad_magic_or_short_file_is_not_a_slot(slot_dir: Path) -> None:
    short = slot_dir / "rank-1.slot"
    short.write_bytes(b"SUPVSLOT")
    assert S.read_slot(short) is None
    bad = slot_dir / "rank-2.slot"
    bad.write_bytes(b"X" * S.SLOT_SIZE)
    assert S.read_slot(bad) is None
    assert S.read_slot(slot_dir / "rank-3.slot") is None  # missing


def test_slot_paths_lists_ranks(slot_dir: Path) -> None:
    for r in (0, 3, 12):
        S.slot_path(slot_dir, r).touch()
    (slot_dir / "rank-x.slot").touch()
    S.stacks_path(slot_dir, 0).touch()
    assert sorted(S.slot_paths(slot_dir)) == [0, 3, 12]
    assert S.slot_paths(slot_dir / "missing") == {}


def test_writer_refuses_symlinks_and_open_directories(slot_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, S.slot_path(slot_dir, 0))
    with pytest.raises(OSError):
        S.SlotWriter.create(slot_dir, 0, 0, 1)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(PermissionError):
        S.check_slot_dir(open_dir)
    S.check_slot_dir(slot_dir)


def test_stack_dump_signal_is_not_one_slurm_uses() -> None:
    import signal

    assert S.STACK_DUMP_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
    assert signal.SIGRTMIN < S.STACK_DUMP_SIGNAL <= signal.SIGRTMAX


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**62),
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_last_beat_always_reads_back(tmp_path_factory: pytest.TempPathFactory, steps: list) -> None:
    d = tmp_path_factory.mktemp("slots")
    w = S.SlotWriter.create(d, 0, 0, 1)
    last_loss: tuple[int, float] | None = None
    for i, loss in steps:
        w.beat(i, loss)
        if loss is not None:
            last_loss = (i, loss)
        rec = S.read_slot(S.slot_path(d, 0))
        assert rec is not None and rec.step == i
        if last_loss is None:
            assert rec.loss_step == -1
        else:
            assert rec.loss_step == last_loss[0]
            assert rec.loss == last_loss[1] or (math.isnan(rec.loss) and math.isnan(last_loss[1]))
    final = S.read_slot(S.slot_path(d, 0))
    assert final is not None and final.beats == len(steps)
    w.close()


class _InterruptAfterPack:
    """Stands in for the hot-part Struct: packs, then raises as a signal handler would right
    after the call returns (KeyboardInterrupt from Ctrl-C, SystemExit from a SIGTERM handler)."""

    def __init__(self, real: object, fail_on: int, exc: type[BaseException]) -> None:
        self.real, self.fail_on, self.exc, self.calls = real, fail_on, exc, 0
        self.size = real.size  # type: ignore[attr-defined]
        self.unpack_from = real.unpack_from  # type: ignore[attr-defined]

    def pack_into(self, *args: object) -> None:
        self.real.pack_into(*args)  # type: ignore[attr-defined]
        self.calls += 1
        if self.calls == self.fail_on:
            raise self.exc()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_exception_escaping_mid_write_leaves_a_complete_record(
    slot_dir: Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException]
) -> None:
    from supervisor.client import writer

    flaky = _InterruptAfterPack(writer._HOT, fail_on=4, exc=exc)  # the writer's 1st pack is at creation
    monkeypatch.setattr(writer, "_HOT", flaky)
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    w.beat(0, 0.0)  # publishes twice (init ends): packs 2 and 3
    with pytest.raises(exc):
        w.beat(1, 1.0)
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.seq % 2 == 0 and (rec.step, rec.loss, rec.beats) == (1, 1.0, 2)
    w.beat(2, 2.0)  # the writer is not stuck in "someone else is writing"
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.seq % 2 == 0 and (rec.step, rec.beats) == (2, 3)
    w.close()


def test_writer_dead_mid_write_still_yields_its_last_fields(slot_dir: Path) -> None:
    w = S.SlotWriter.create(slot_dir, 0, 0, 1)
    w.beat(41, 0.5)
    words = memoryview(w.buf).cast("Q")
    words[S.OFF_RANK_SEQ // 8] += 1  # as if SIGKILLed between the two sequence stores
    assert S.read_slot(S.slot_path(slot_dir, 0)) is None  # could be a writer just descheduled
    rec = S.read_slot(S.slot_path(slot_dir, 0), allow_torn=True)  # the agent knows the pid is gone
    assert rec is not None and rec.seq % 2 == 1 and rec.step == 41
    words.release()
    w.close()
