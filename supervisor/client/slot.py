"""The per-rank shared-memory slot: the agent-side reader, and one import point for the layout
(``supervisor.client.layout``) and the rank-side writer (``supervisor.client.writer``).

WHY a file on /dev/shm mapped by both sides: the training rank publishes its progress with plain
memory stores (no syscall on the hot path) and the node agent samples it whenever it likes; the
supervisor answers through a small control area in the same mapping. Stdlib only. The layout
table and the seqlock protocol are documented in ``supervisor.client.layout`` and docs/client.md.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from supervisor.client.layout import (
    _COLD,
    _CONTROL,
    _FLAGS_FIELD,
    _HEADER,
    _HOT,
    _HOT_BEATS,
    _READ_RETRIES,
    _RESTORE,
    _RING,
    _SEQ,
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
    PHASE_CODES,
    PHASE_EVAL,
    PHASE_INIT,
    PHASE_RESTORE,
    PHASE_STEP,
    PHASES,
    RANK_FLAG_AWAITING_RESTART,
    RANK_FLAG_ENDED_CLEAN,
    RANK_FLAG_EXITING,
    RANK_FLAG_IN_CHECKPOINT,
    RANK_FLAG_PEER_FAILED,
    RANK_FLAG_RESTARTABLE,
    RANK_FLAG_RETURNED,
    RANK_FLAG_SIGTERM,
    RANK_FLAG_STACK_DUMPS,
    RANK_FLAG_WAITS,
    RING,
    SLOT_SIZE,
    STACK_DUMP_SIGNAL,
    WAIT_RING,
    ControlState,
    SlotRecord,
    _open_private,
    _recent_iterations,
    _recent_own,
    check_slot_dir,
    iteration_stats,
    slot_path,
    slot_paths,
    stacks_path,
    wait_entry,
)
from supervisor.client.writer import SlotWriter

__all__ = [
    "FLAG_CHECKPOINT", "FLAG_STOP", "LAYOUT_VERSION", "MAGIC", "OFF_ASYNC_FLAGS", "OFF_COLD", "OFF_CONTROL",
    "OFF_CONTROL_SEQ", "OFF_HEADER", "OFF_HOT", "OFF_RANK_SEQ", "OFF_RESTORE", "OFF_RING", "OFF_STATIC", "PHASES", "PHASE_CHECKPOINT",
    "PHASE_CODES", "PHASE_EVAL", "PHASE_INIT", "PHASE_RESTORE", "PHASE_STEP", "RANK_FLAG_AWAITING_RESTART", "RANK_FLAG_ENDED_CLEAN", "RANK_FLAG_EXITING",
    "RANK_FLAG_IN_CHECKPOINT", "RANK_FLAG_RESTARTABLE", "RANK_FLAG_RETURNED", "RANK_FLAG_PEER_FAILED",
    "RANK_FLAG_SIGTERM", "RANK_FLAG_STACK_DUMPS", "RANK_FLAG_WAITS", "RING", "OFF_WAITS", "WAIT_RING", "SLOT_SIZE", "STACK_DUMP_SIGNAL", "ControlState",
    "SlotReader", "SlotRecord", "SlotWriter", "check_slot_dir", "iteration_stats", "open_slot_for_reading",
    "read_slot", "slot_path", "slot_paths", "stacks_path", "wait_entry", "_open_private",
]  # fmt: skip


def _read_seqlocked(
    buf: mmap.mmap, seq_off: int, payload: struct.Struct, off: int
) -> tuple[int, tuple] | None:
    for _ in range(_READ_RETRIES):
        (seq1,) = _SEQ.unpack_from(buf, seq_off)
        if seq1 & 1:
            continue
        values = payload.unpack_from(buf, off)
        (seq2,) = _SEQ.unpack_from(buf, seq_off)
        if seq1 == seq2:
            return seq1, values
    return None


def _decode(buf: mmap.mmap, allow_torn: bool = False) -> SlotRecord | None:
    if len(buf) < SLOT_SIZE:
        return None
    magic, version, size = _HEADER.unpack_from(buf, OFF_HEADER)
    if magic != MAGIC or version != LAYOUT_VERSION or size != SLOT_SIZE:
        return None
    for _ in range(_READ_RETRIES):
        (seq1,) = _SEQ.unpack_from(buf, OFF_RANK_SEQ)
        if seq1 & 1:
            continue
        copy = buf[:SLOT_SIZE]  # one memcpy: keeps the window between the two reads short
        (seq2,) = _SEQ.unpack_from(buf, OFF_RANK_SEQ)
        if seq1 == seq2:
            return _snapshot(copy, seq1)
    if allow_torn:  # the caller knows the writer is dead: its last fields, as they are
        return _snapshot(buf[:SLOT_SIZE], _SEQ.unpack_from(buf, OFF_RANK_SEQ)[0])
    return None  # the writer is mid-write (maybe descheduled, maybe dead): no snapshot this time


def _snapshot(data: bytes, seq: int) -> SlotRecord:
    static = _STATIC.unpack_from(data, OFF_STATIC)
    hot = _HOT.unpack_from(data, OFF_HOT)
    cold = _COLD.unpack_from(data, OFF_COLD)
    ring = _RING.unpack_from(data, OFF_RING)
    (async_flags,) = _SEQ.unpack_from(data, OFF_ASYNC_FLAGS)
    fields = list(static + hot + cold[:-1])
    fields[_FLAGS_FIELD] |= async_flags
    beats = hot[_HOT_BEATS]
    recent = _recent_iterations(ring, beats)
    ewma, lo, hi = iteration_stats(recent)
    own: tuple[int, ...] = ()
    if fields[_FLAGS_FIELD] & RANK_FLAG_WAITS:
        own = _recent_own(ring, _WAITS.unpack_from(data, OFF_WAITS), beats)
    restore_ms, restores = _RESTORE.unpack_from(data, OFF_RESTORE)
    return SlotRecord._make([*fields, seq, recent, ewma, lo, hi, cold[-1], own, iteration_stats(own)[0],
                             restore_ms, restores])


def read_slot(
    path_or_mmap: str | os.PathLike[str] | mmap.mmap, allow_torn: bool = False
) -> SlotRecord | None:
    """A consistent snapshot, or None if the slot is missing, too short, not (yet) a valid slot, or
    being written. ``allow_torn``: for a writer known to be dead (it may have died mid-write),
    return its fields as they are instead of None; an odd ``seq`` then says they may mix two
    updates."""
    if isinstance(path_or_mmap, mmap.mmap):
        return _decode(path_or_mmap, allow_torn)
    try:
        fd = os.open(path_or_mmap, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < SLOT_SIZE:
            return None
        with mmap.mmap(fd, SLOT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ) as buf:
            return _decode(buf, allow_torn)
    finally:
        os.close(fd)


class SlotReader:
    """Agent side: samples a rank's record and writes the control area. Maps lazily: the rank may
    have created the file but not sized it yet."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._buf: mmap.mmap | None = None

    def _map(self) -> mmap.mmap | None:
        if self._buf is None and self._fd is not None:
            if os.fstat(self._fd).st_size >= SLOT_SIZE:
                self._buf = mmap.mmap(self._fd, SLOT_SIZE, mmap.MAP_SHARED)
        return self._buf

    def read(self, allow_torn: bool = False) -> SlotRecord | None:
        """See ``read_slot``; None also while the rank has not sized the file yet."""
        buf = self._map()
        return None if buf is None else _decode(buf, allow_torn)

    def read_control(self) -> ControlState | None:
        buf = self._map()
        if buf is None:
            return None
        got = _read_seqlocked(buf, OFF_CONTROL_SEQ, _CONTROL, OFF_CONTROL)
        return None if got is None else ControlState(*got[1])

    def set_control_flags(self, flags: int, at_step: int = 0) -> bool:
        """Publish control flags. Every call with non-zero flags is a NEW request (the counter is
        bumped), so call it once per request, not from a polling loop; 0 withdraws requests.
        ``at_step``: ranks act when their step >= at_step, so all ranks of a synchronous job can
        checkpoint at the same step (pick it above every rank's current step). Single writer only.
        Returns False if the slot is not mapped yet."""
        buf = self._map()
        if buf is None:
            return False
        (seq,) = _SEQ.unpack_from(buf, OFF_CONTROL_SEQ)
        seq |= 1
        _, request, _ = _CONTROL.unpack_from(buf, OFF_CONTROL)
        if flags:
            request = (request + 1) & 0xFFFFFFFF
        _SEQ.pack_into(buf, OFF_CONTROL_SEQ, seq)
        _CONTROL.pack_into(buf, OFF_CONTROL, int(flags) & 0xFFFFFFFF, request, int(at_step))
        _SEQ.pack_into(buf, OFF_CONTROL_SEQ, seq + 1)
        return True

    def close(self) -> None:
        if self._buf is not None:
            self._buf.close()
            self._buf = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SlotReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_slot_for_reading(path: str | os.PathLike[str]) -> SlotReader:
    """Open a rank's slot for the agent. Raises OSError if the file does not exist."""
    return SlotReader(path)
