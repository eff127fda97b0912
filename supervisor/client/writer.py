"""The rank-side writer of the shared-memory slot (layout: ``supervisor.client.layout``).

WHY closures over module constants: ``beat`` runs once per training step, so its state lives in
closure cells and its targets in memoryviews set up once; see ``SlotWriter``.
"""

from __future__ import annotations

import math
import mmap
import operator
import os
import time
from collections.abc import Callable
from typing import Any

from supervisor.client.layout import (
    _COLD,
    _CONTROL,
    _HEADER,
    _HOT,
    _READ_RETRIES,
    _RESTORE,
    _RING,
    _STATIC,
    _WAITS,
    FLAG_CHECKPOINT,
    FLAG_STOP,
    LAYOUT_VERSION,
    MAGIC,
    OFF_ASYNC_FLAGS,
    OFF_COLD,
    OFF_CONTROL,
    OFF_CONTROL_SEQ,
    OFF_HEADER,
    OFF_HOT,
    OFF_RANK_SEQ,
    OFF_RESTORE,
    OFF_RING,
    OFF_STATIC,
    OFF_WAITS,
    PHASE_CHECKPOINT,
    PHASE_INIT,
    PHASE_RESTORE,
    PHASE_STEP,
    RANK_FLAG_IN_CHECKPOINT,
    RANK_FLAG_SIGTERM,
    RANK_FLAG_WAITS,
    RING,
    SLOT_SIZE,
    WAIT_NS_MASK,
    WAIT_RING,
    WAIT_TAG_MASK,
    WAIT_TAG_SHIFT,
    ControlState,
    _open_private,
    slot_path,
)


class SlotWriter:
    """Rank side: owns the rank record.

    ``beat`` is the hot path: a clock read, five 8-byte stores (sequence twice, step, time, beat
    count; the loss adds one ``pack_into``) and one step-time store into the ring; no syscalls,
    no statistics (the reader derives them). ``on_error(exc, i, loss)`` receives what ``beat``
    cannot handle (a bad argument, a vanished mapping); without it ``beat`` raises.

    The state lives in closure cells (faster than attributes). Writes are safe against re-entry
    from Python signal handlers: a nested write sees an odd sequence, updates the state, marks it
    dirty and returns, and the interrupted write publishes again before it returns."""

    def __init__(
        self,
        buf: mmap.mmap,
        pid: int,
        rank: int,
        local_rank: int,
        world_size: int,
        on_error: Callable[[Exception, Any, Any], None] | None = None,
    ) -> None:
        self.buf = buf
        self.on_error = on_error
        self.pid, self.rank, self.local_rank, self.world_size = pid, rank, local_rank, world_size
        # Views with the hot path's targets at index/offset 0 (fewer operations per store);
        # 8-byte aligned items, so each item store is a single store.
        self._words = memoryview(buf).cast("Q")
        self._seqv = memoryview(buf)[OFF_RANK_SEQ : OFF_RANK_SEQ + 8].cast("Q")
        self._hotv = memoryview(buf)[OFF_HOT : OFF_HOT + _HOT.size]
        self._hotq = self._hotv.cast("q")  # step, t_last_beat_ns, (loss), loss_step, beats
        self._ring = memoryview(buf)[OFF_RING : OFF_RING + _RING.size].cast("q")
        self._waits = memoryview(buf)[OFF_WAITS : OFF_WAITS + _WAITS.size].cast("Q")
        self._bind()

    @classmethod
    def create(
        cls,
        slot_dir: str | os.PathLike[str],
        rank: int,
        local_rank: int,
        world_size: int,
        on_error: Callable[[Exception, Any, Any], None] | None = None,
    ) -> SlotWriter:
        """Create (or take over, after a restart) ``rank-<rank>.slot`` and map it. Raises OSError."""
        path = slot_path(slot_dir, rank)
        fd = _open_private(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != SLOT_SIZE:
                os.ftruncate(fd, SLOT_SIZE)
            buf = mmap.mmap(fd, SLOT_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)  # the mapping keeps the file alive
        return cls(buf, os.getpid(), rank, local_rank, world_size, on_error)

    def _bind(self) -> None:  # noqa: C901 - one closure scope on purpose (speed)
        buf, words, seqv, ring, waits = self.buf, self._words, self._seqv, self._ring, self._waits
        hotv, hotq = self._hotv, self._hotq
        mono = time.monotonic_ns
        pack_hot, pack_cold, pack_restore = _HOT.pack_into, _COLD.pack_into, _RESTORE.pack_into
        unpack_control = _CONTROL.unpack_from
        ctl_seq_i, async_i = OFF_CONTROL_SEQ // 8, OFF_ASYNC_FLAGS // 8
        ring_mask = RING - 1
        ckpt_or_stop = FLAG_CHECKPOINT | FLAG_STOP
        index = operator.index
        on_error = self.on_error

        def read_control() -> tuple[int, tuple[int, int, int]] | None:
            """(control sequence, (flags, request, at_step)), or None if never stable."""
            for _ in range(_READ_RETRIES):
                s1 = words[ctl_seq_i]
                if s1 & 1:
                    continue
                values = unpack_control(buf, OFF_CONTROL)
                if words[ctl_seq_i] == s1:
                    return s1, values
            return None

        now = mono()
        seq = seqv[0] | 1  # continue from a previous incarnation's count: never go back
        step, t_last, t_phase, t_mark = -1, 0, now, now
        last_loss, loss_step, beats, last_ckpt = math.nan, -1, 0, -1
        phase, flags = PHASE_INIT, 0
        ckpt_ms, t_ckpt = 0, now  # milliseconds spent in (outermost) checkpoint phases; when the current began
        restore_ms, restores, t_restore = 0, 0, now  # the same for restore phases, and how many ended
        ctl = read_control()
        base_request = acked = ctl[1][1] if ctl else 0  # requests older than this process are not ours
        # Control sequence at which should_checkpoint()/should_stop() last found nothing for
        # them: until the control area changes, they answer False from one 8-byte load.
        quiet_ckpt = quiet_stop = -1
        async_flags = 0
        dirty = False

        def write_state() -> None:
            """Inside an open write: the hot and cold parts from the current state."""
            pack_hot(hotv, 0, step, t_last, last_loss, loss_step, beats)
            pack_cold(buf, OFF_COLD, t_phase, last_ckpt, phase, flags, acked, ckpt_ms & 0xFFFFFFFF)
            pack_restore(buf, OFF_RESTORE, restore_ms & 0xFFFFFFFF, restores & 0xFFFFFFFF)

        def finish() -> None:
            """Complete a write left open (odd sequence) from the current state, which is always
            consistent at the points where Python can interrupt us (calls). For the owner of the
            open write when an exception (KeyboardInterrupt, SystemExit from a signal handler)
            escapes it, and for a SIGTERM handler about to let the process die."""
            nonlocal seq
            if seq & 1:
                write_state()
                seq += 1
                seqv[0] = seq

        def publish() -> None:
            nonlocal seq, dirty
            if seq & 1:  # re-entered from a signal handler mid-write: the outer write redoes it
                dirty = True
                return
            try:
                while True:
                    dirty = False
                    seq += 1
                    seqv[0] = seq
                    write_state()
                    seq += 1
                    seqv[0] = seq
                    if not dirty:
                        return
            except BaseException:
                finish()  # the sequence is odd only by our own write here
                raise

        def beat(i: int, loss: float | None = None) -> None:
            """End of iteration ``i``, with the loss if known (float-convertible). Errors (a bad
            argument, a vanished mapping) go to ``on_error`` when one was given."""
            nonlocal seq, step, t_last, t_mark, last_loss, loss_step, beats, phase, t_phase, dirty
            owned = False  # whether this call opened the write (made the sequence odd)
            try:
                if loss is not None and loss.__class__ is not float:
                    loss = float(loss)  # int, numpy scalar, 0-d tensor (a CUDA tensor syncs here)
                now = mono()
                # No call from here on until the state is complete: Python runs signal handlers
                # only at calls, and they must never see (or publish) a half-updated state.
                if seq & 1:  # re-entered (a signal handler called step()): the outer write publishes
                    i = index(i)
                    ring[beats & ring_mask] = now - t_mark  # inside its open write: safe
                    t_mark = t_last = now
                    step = i
                    beats += 1
                    if loss is not None:
                        last_loss, loss_step = loss, i
                    if not phase:
                        phase, t_phase = PHASE_STEP, now
                    dirty = True
                    return
                seq += 1
                seqv[0] = seq
                owned = True
                hotq[0] = i  # first: a step that is not an integer raises before any state changes
                ring[beats & ring_mask] = now - t_mark  # < 0 if a handler moved t_mark
                t_mark = t_last = now
                step = i
                beats += 1
                if loss is None:  # two word stores are cheaper than packing the hot part
                    hotq[1] = now
                    hotq[4] = beats
                else:
                    last_loss, loss_step = loss, i
                    pack_hot(hotv, 0, i, now, loss, i, beats)
                seq += 1
                seqv[0] = seq
                owned = False
                if dirty or not phase:  # a nested write to redo, or the first step ends init
                    if not phase:
                        phase, t_phase = PHASE_STEP, now
                    publish()
            except Exception as exc:
                if owned:
                    try:
                        finish()
                    except Exception:  # noqa: S110 - the mapping is gone: on_error decides
                        pass
                if on_error is None:
                    raise
                on_error(exc, i, loss)
            except BaseException:
                if owned:
                    finish()
                raise

        def enter_phase(code: int) -> int:
            """Switch to phase ``code``; returns the previous phase code (to restore on exit)."""
            nonlocal phase, t_phase, flags, t_ckpt, t_restore
            previous = phase
            phase, t_phase = code, mono()
            if code == PHASE_CHECKPOINT:
                flags |= RANK_FLAG_IN_CHECKPOINT
                if previous != PHASE_CHECKPOINT:
                    t_ckpt = t_phase
            elif code == PHASE_RESTORE and previous != PHASE_RESTORE:
                t_restore = t_phase
            publish()
            return previous

        def exit_phase(code: int, previous: int, completed: bool) -> None:
            """Leave phase ``code`` back to ``previous``. A completed checkpoint phase acknowledges
            every request published before it ended (see docs/client.md, "Checkpoint requests")."""
            nonlocal phase, t_phase, flags, acked, last_ckpt, t_mark, ckpt_ms, restore_ms, restores
            now = mono()
            if code == PHASE_CHECKPOINT and previous != PHASE_CHECKPOINT:
                ckpt_ms += (now - t_ckpt) // 1_000_000  # the stall, measured here (completed or not)
            elif code == PHASE_RESTORE and previous != PHASE_RESTORE:
                restore_ms += (now - t_restore) // 1_000_000  # the state load, measured here (completed or not)
                restores += 1
            if code == PHASE_CHECKPOINT:
                if completed:
                    got = read_control()
                    if got is not None:
                        acked = got[1][1]
                    last_ckpt = step
                if previous != PHASE_CHECKPOINT:
                    flags &= ~RANK_FLAG_IN_CHECKPOINT
            if code != PHASE_STEP:
                t_mark = now  # the next step time is measured from here, not from the last beat
            if previous == PHASE_INIT and beats:
                previous = PHASE_STEP  # a step happened inside this phase: init is over
            phase, t_phase = previous, now
            publish()

        def set_async_flag(flag: int) -> None:
            """Signal-safe: one aligned 8-byte store outside the seqlock (SIGTERM, exit)."""
            nonlocal async_flags
            async_flags |= flag
            words[async_i] = async_flags

        def clear_async_flag(flag: int) -> None:
            """The rank's own flags only (AWAITING_RESTART once its restart order came); one aligned store."""
            nonlocal async_flags
            async_flags &= ~flag
            words[async_i] = async_flags

        def async_flag_set(flag: int) -> bool:
            return bool(async_flags & flag)

        def should_checkpoint() -> bool:
            nonlocal quiet_ckpt
            if words[ctl_seq_i] == quiet_ckpt:
                return False
            got = read_control()
            if got is None:
                return False
            ctl_seq, (ctl_flags, request, at_step) = got
            if not ctl_flags & ckpt_or_stop or request == acked:
                quiet_ckpt = ctl_seq  # acked only ever catches up with request: stays quiet
                return False
            return at_step <= 0 or step >= at_step

        def should_stop() -> bool:
            nonlocal quiet_stop
            if async_flags & RANK_FLAG_SIGTERM:
                return True
            if words[ctl_seq_i] == quiet_stop:
                return False
            got = read_control()
            if got is None:
                return False
            ctl_seq, (ctl_flags, request, at_step) = got
            if not ctl_flags & FLAG_STOP or request == base_request:
                quiet_stop = ctl_seq
                return False
            return at_step <= 0 or step >= at_step

        def enable_waits() -> None:
            """Claim the wait ring (RANK_FLAG_WAITS): from now on the reader derives own times. Call it from
            the thread that calls ``beat`` (it publishes under the seqlock)."""
            nonlocal flags
            if not flags & RANK_FLAG_WAITS:
                flags |= RANK_FLAG_WAITS
                publish()

        wait_mask = WAIT_RING - 1

        def add_wait(ns: int) -> None:
            """Add ``ns`` waited for peers to the step in progress (the next beat's). One aligned 8-byte store
            outside the seqlock, so any thread may call it (a comm hook's completion callback): the entry carries
            its beat number, and a reader takes it only for that beat."""
            b = beats + 1
            i = beats & wait_mask
            tag = b & WAIT_TAG_MASK
            entry = waits[i]
            if entry >> WAIT_TAG_SHIFT == tag:
                ns += entry & WAIT_NS_MASK
            waits[i] = tag << WAIT_TAG_SHIFT | (ns if 0 <= ns <= WAIT_NS_MASK else (0 if ns < 0 else WAIT_NS_MASK))

        def read_control_state() -> ControlState | None:
            got = read_control()
            return None if got is None else ControlState(*got[1])

        # Initial record: static part, cleared ring and dynamic part under one odd sequence.
        seqv[0] = seq
        _STATIC.pack_into(buf, OFF_STATIC, self.pid, self.rank, self.local_rank, self.world_size,
                          now, time.time_ns())  # fmt: skip
        _RING.pack_into(buf, OFF_RING, *([0] * RING))
        _WAITS.pack_into(buf, OFF_WAITS, *([0] * WAIT_RING))
        words[async_i] = 0
        seq += 1
        publish()
        _HEADER.pack_into(buf, OFF_HEADER, MAGIC, LAYOUT_VERSION, SLOT_SIZE)

        self.read_control = read_control_state
        self.publish = publish
        self.finish = finish
        self.beat = beat
        self.enter_phase = enter_phase
        self.exit_phase = exit_phase
        self.set_async_flag = set_async_flag
        self.clear_async_flag = clear_async_flag
        self.async_flag_set = async_flag_set
        self.should_checkpoint = should_checkpoint
        self.should_stop = should_stop
        self.enable_waits = enable_waits
        self.add_wait = add_wait

    def close(self) -> None:
        """Unmap (the file stays for the agent). Later calls on this writer raise ValueError."""
        for view in (self._words, self._seqv, self._hotq, self._hotv, self._ring, self._waits):
            view.release()
        self.buf.close()
