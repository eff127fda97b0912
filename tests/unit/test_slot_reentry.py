"""Python signal handlers run between bytecodes, at calls, so a handler calling the client can
interrupt the slot writer in the middle of a write. Hypothesis generates programs of steps, phase
blocks and flag changes, and injects further such operations at every call the writer makes inside
an open write (its ``pack_into`` calls); after every top-level operation the slot must hold a
complete, consistent record equal to a simple model of what happened."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.client import slot as S
from supervisor.client import writer as W

# An operation: ("beat", loss or None) | ("eval",) | ("sigterm",)
ops = st.one_of(
    st.tuples(st.just("beat"), st.one_of(st.none(), st.floats(allow_nan=False, width=32))),
    st.tuples(st.just("eval")),
    st.tuples(st.just("sigterm")),
)


class Model:
    def __init__(self) -> None:
        self.step, self.beats, self.loss, self.loss_step, self.flags = -1, 0, math.nan, -1, 0


class Injector:
    """Stands in for a Struct: packs, then runs the next scheduled nested operation, as a signal
    handler would right after the call returns."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.size = real.size  # type: ignore[attr-defined]
        self.unpack_from = real.unpack_from  # type: ignore[attr-defined]
        self.pending: list[Callable[[], None]] = []
        self.seq_now: Callable[[], int] | None = None
        self.closed_writes = 0  # packs seen while the sequence was even: a reader could see them

    def pack_into(self, *args: object) -> None:
        if self.seq_now is not None and not self.seq_now() & 1:
            self.closed_writes += 1
        self.real.pack_into(*args)  # type: ignore[attr-defined]
        if self.pending:
            self.pending.pop(0)()


def _run(w: S.SlotWriter, model: Model, op: tuple, counter: list[int]) -> None:
    if op[0] == "beat":
        counter[0] += 1
        i = counter[0]
        model.step, model.beats = i, model.beats + 1  # before the call: nested ops come after it
        if op[1] is not None:
            model.loss, model.loss_step = float(op[1]), i
        w.beat(i, op[1])
    elif op[0] == "eval":
        prev = w.enter_phase(S.PHASE_EVAL)
        w.exit_phase(S.PHASE_EVAL, prev, True)
    else:
        w.set_async_flag(S.RANK_FLAG_SIGTERM)
        model.flags |= S.RANK_FLAG_SIGTERM


@settings(max_examples=200, deadline=None)
@given(program=st.lists(st.tuples(ops, st.lists(ops, max_size=3)), min_size=1, max_size=12))
def test_nested_writes_leave_a_consistent_record(
    tmp_path_factory: pytest.TempPathFactory, program: list
) -> None:
    hot, cold = Injector(W._HOT), Injector(W._COLD)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(W, "_HOT", hot)
        m.setattr(W, "_COLD", cold)
        d = tmp_path_factory.mktemp("slots")
        w = S.SlotWriter.create(d, 0, 0, 1)
    raw = S.open_slot_for_reading(S.slot_path(d, 0))  # an independent mapping, as the agent has
    words = memoryview(raw._map()).cast("Q")  # type: ignore[arg-type]
    hot.seq_now = cold.seq_now = lambda: int(words[S.OFF_RANK_SEQ // 8])
    model, counter = Model(), [-1]
    for top, nested in program:
        # Nested operations fire at the writer's next pack_into calls (hot or cold part), i.e.
        # inside open writes.
        hot.pending = cold.pending = [functools.partial(_run, w, model, op, counter) for op in nested]
        _run(w, model, top, counter)
        hot.pending.clear()
        assert hot.closed_writes == cold.closed_writes == 0  # every write inside an odd sequence
        rec = S.read_slot(S.slot_path(d, 0))
        assert rec is not None and rec.seq % 2 == 0
        assert (rec.step, rec.beats, rec.loss_step) == (model.step, model.beats, model.loss_step)
        assert rec.loss == model.loss or (math.isnan(rec.loss) and math.isnan(model.loss))
        assert rec.rank_flags & S.RANK_FLAG_SIGTERM == model.flags & S.RANK_FLAG_SIGTERM
        assert not rec.rank_flags & S.RANK_FLAG_IN_CHECKPOINT
        assert rec.phase_name == ("step" if model.beats else "init")
        assert all(t > 0 for t in rec.recent_iter_ns)
    words.release()
    raw.close()
    w.close()


def test_injector_really_nests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness above only means something if nested operations do run inside open writes."""
    hot = Injector(W._HOT)
    monkeypatch.setattr(W, "_HOT", hot)
    w = S.SlotWriter.create(tmp_path, 0, 0, 1)
    seen: list[bool] = []

    def handler() -> None:
        seen.append(S.read_slot(S.slot_path(tmp_path, 0)) is None)

    hot.pending = [handler]
    w.beat(0, 1.0)
    assert seen == [True]  # the record was mid-write (odd sequence) when the "handler" ran
    w.close()
