"""The per-rank shared-memory slot: binary layout, the rank-side writer and the agent-side reader.

WHY a file on /dev/shm mapped by both sides: the training rank publishes its progress with plain
memory stores (no syscall on the hot path) and the node agent samples it whenever it likes; the
supervisor answers through a small control area in the same mapping. Stdlib only: this module is
imported inside every training rank and by the agent.

Layout (little endian, ``SLOT_SIZE`` bytes, offsets in bytes):

====== ======================================================= ============
offset field                                                    written by
====== ======================================================= ============
0      magic ``b"SUPVSLOT"`` (8s), layout version (u32),        rank (once)
       slot size (u32)
64     rank record sequence (u64): odd while the rank writes    rank
72     pid, rank, local rank, world size (4 x i32);             rank (once)
       start monotonic ns, start wall-clock ns (2 x i64)
104    hot part, rewritten by every beat: step,                 rank
       t_last_beat_ns (2 x i64), loss (f64), loss_step, beats
       (2 x i64)
144    cold part: t_phase_ns, last_ckpt_step (2 x i64),         rank
       phase code, rank flags, acked request (3 x u32), pad
176    asynchronous rank flags (u64, one store, no seqlock:     rank
       set from signal handlers); readers OR them into flags
256    control sequence (u64): odd while the agent writes       agent
264    control flags (u32), request counter (u32),              agent
       at_step (i64)
512    ring of the last 64 step times in ns (64 x i64): beat     rank
       number b (1-based) writes the time since the previous
       beat, or since leaving another phase (checkpoint, eval),
       to entry (b - 1) % 64; beat 1's entry and entries <= 0
       mean "no step time"
====== ======================================================= ============

Both areas are seqlocks: the writer makes the sequence odd, writes the payload, makes it even; a
reader copies sequence, payload, sequence and retries until both sequences are equal and even.
This relies on stores not being reordered (true on x86-64, TSO); on weakly ordered CPUs a reader
may, rarely, accept a torn record, which only ever feeds heuristics.

The rank only stores raw step times (a ring); the reader derives EWMA, min and max from them,
which keeps the rank's hot path to a handful of stores.

Times are ``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns``), system-wide on Linux, so the
agent on the same node compares them with its own clock to get ages.
"""

from __future__ import annotations

import math
import mmap
import operator
import os
import signal
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

MAGIC = b"SUPVSLOT"
LAYOUT_VERSION = 1
SLOT_SIZE = 1024

# Phase codes are indexes into PHASES; never reorder, only append (and bump LAYOUT_VERSION if the
# meaning of an existing code changes).
PHASES: tuple[str, ...] = ("init", "step", "checkpoint", "eval", "restore", "data", "other")
PHASE_CODES: dict[str, int] = {name: code for code, name in enumerate(PHASES)}
PHASE_INIT, PHASE_STEP, PHASE_CHECKPOINT, PHASE_EVAL = 0, 1, 2, 3

# Control flags, written by the agent/supervisor.
FLAG_CHECKPOINT = 1 << 0  # please checkpoint (at or after ``at_step``)
FLAG_STOP = 1 << 1  # please checkpoint, then stop

# Rank flags, written by the rank.
RANK_FLAG_SIGTERM = 1 << 0  # the rank received SIGTERM
RANK_FLAG_IN_CHECKPOINT = 1 << 1  # the rank is inside a ``phase("checkpoint")`` block
RANK_FLAG_STACK_DUMPS = 1 << 2  # STACK_DUMP_SIGNAL is handled: safe to send (else it kills the rank)
RANK_FLAG_EXITING = 1 << 3  # the interpreter is shutting down normally (atexit ran)

# Sent by the agent to a rank pid to get all thread stacks appended to ``rank-N.stacks``. A
# real-time signal because Slurm uses SIGUSR1/SIGUSR2 and glibc reserves the first two RT signals.
STACK_DUMP_SIGNAL: int = int(signal.SIGRTMIN) + 2

_HEADER = struct.Struct("<8sII")
_SEQ = struct.Struct("<Q")
_STATIC = struct.Struct("<iiiiqq")
_HOT = struct.Struct("<qqdqq")  # rewritten by every beat
_COLD = struct.Struct("<qqIIII")  # rewritten on phase changes and acknowledgements
_CONTROL = struct.Struct("<IIq")
RING = 64  # iteration times kept; a power of two
_RING = struct.Struct(f"<{RING}q")

OFF_HEADER = 0
OFF_RANK_SEQ = 64
OFF_STATIC = OFF_RANK_SEQ + _SEQ.size  # 72
OFF_HOT = OFF_STATIC + _STATIC.size  # 104
OFF_COLD = OFF_HOT + _HOT.size  # 144
OFF_ASYNC_FLAGS = OFF_COLD + _COLD.size  # 176
OFF_CONTROL_SEQ = 256
OFF_CONTROL = OFF_CONTROL_SEQ + _SEQ.size  # 264
OFF_RING = 512
assert OFF_ASYNC_FLAGS % 8 == 0 and OFF_ASYNC_FLAGS + 8 <= OFF_CONTROL_SEQ
assert OFF_CONTROL + _CONTROL.size <= OFF_RING and OFF_RING + _RING.size <= SLOT_SIZE

_READ_RETRIES = 1000


class SlotRecord(NamedTuple):
    """One consistent snapshot of a rank's slot (decoded). -1 / NaN / 0 mean "not yet known"."""

    pid: int
    rank: int
    local_rank: int
    world_size: int
    start_mono_ns: int
    start_wall_ns: int
    step: int  # last step passed to client.step(); -1 before the first
    t_last_beat_ns: int  # monotonic ns of the last client.step(); 0 before the first
    loss: float  # last loss passed to client.step(); NaN/Inf preserved; NaN if never given
    loss_step: int  # the step that loss belongs to; -1 if no loss was ever given
    beats: int  # number of client.step() calls
    t_phase_ns: int  # monotonic ns when the current phase was entered
    last_ckpt_step: int  # step at the end of the last completed checkpoint phase; -1 if none
    phase: int  # code, see PHASES
    rank_flags: int  # RANK_FLAG_* bits
    acked_request: int  # control request counter the rank last satisfied (or saw at start)
    seq: int  # sequence number of this snapshot; odd only from read(allow_torn=True)
    # Derived by the reader from the ring: times between consecutive steps, excluding time spent
    # in other phases (checkpoint, eval...); oldest first; at most RING - 1; empty until two steps.
    recent_iter_ns: tuple[int, ...] = ()
    iter_ewma_ns: int = 0  # EWMA (alpha 1/8, integer) over recent_iter_ns; 0 if empty
    iter_min_ns: int = 0  # min/max over recent_iter_ns (the last 63 steps); 0 if empty
    iter_max_ns: int = 0

    @property
    def phase_name(self) -> str:
        return PHASES[self.phase] if 0 <= self.phase < len(PHASES) else f"unknown({self.phase})"

    def last_sign_of_life_ns(self) -> int:
        """Monotonic ns of the latest beat or phase change: the agent's reference for "silent for"."""
        return max(self.t_last_beat_ns, self.t_phase_ns)


class ControlState(NamedTuple):
    """The supervisor-written control area."""

    flags: int
    request: int  # incremented by every non-zero set_control_flags()
    at_step: int  # act once the rank's step >= at_step (<= 0: at once)


_FLAGS_FIELD = SlotRecord._fields.index("rank_flags")
_HOT_BEATS = 4  # index of ``beats`` in _HOT


def _recent_iterations(ring: tuple[int, ...], beats: int) -> tuple[int, ...]:
    first = max(2, beats - RING + 1)  # beat 1 has no previous beat: its entry is not a step time
    times = (ring[(b - 1) % RING] for b in range(first, beats + 1))
    return tuple(t for t in times if t > 0)


def iteration_stats(times: tuple[int, ...]) -> tuple[int, int, int]:
    """(EWMA with alpha 1/8 in integer ns, min, max) of iteration times, oldest first; zeros if none."""
    if not times:
        return 0, 0, 0
    ewma = times[0]
    for t in times[1:]:
        ewma += (t - ewma) >> 3
    return ewma, min(times), max(times)


def slot_path(slot_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(slot_dir) / f"rank-{int(rank)}.slot"


def stacks_path(slot_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(slot_dir) / f"rank-{int(rank)}.stacks"


def slot_paths(slot_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """Global rank -> slot file for every ``rank-N.slot`` in the directory (empty if it is missing)."""
    found: dict[int, Path] = {}
    try:
        entries = list(Path(slot_dir).iterdir())
    except OSError:
        return found
    for entry in entries:
        name = entry.name
        if name.startswith("rank-") and name.endswith(".slot") and name[5:-5].isdigit():
            found[int(name[5:-5])] = entry
    return found


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
    recent = _recent_iterations(ring, hot[_HOT_BEATS])
    ewma, lo, hi = iteration_stats(recent)
    return SlotRecord._make([*fields, seq, recent, ewma, lo, hi])


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


def _open_private(path: Path, flags: int) -> int:
    """Create with O_EXCL (0600), or open an existing file we own; never follow symlinks."""
    base = os.O_NOFOLLOW | os.O_CLOEXEC | flags
    try:
        return os.open(path, base | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, base)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise PermissionError(f"{path} is not a regular file owned by this user") from None
        os.fchmod(fd, 0o600)
        return fd


def check_slot_dir(slot_dir: Path) -> None:
    """Raise OSError unless slot_dir is a directory owned by us and closed to group/others."""
    st = os.stat(slot_dir, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{slot_dir} is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{slot_dir} must be owned by uid {os.geteuid()} with mode 0700")


class SlotWriter:
    """Rank side: owns the rank record. ``on_error(exc, i, loss)`` receives what ``beat`` cannot
    handle (a bad argument, a vanished mapping); without it ``beat`` raises. ``beat`` is the hot path: a clock read, three 8-byte
    stores and one ``pack_into`` on the mapping; no syscalls, no statistics (the reader derives
    them from the ring of iteration times).

    The state lives in closure cells (faster than attributes). Publishing is safe against
    re-entry from Python signal handlers: a nested publish sees an odd sequence, marks the record
    dirty and returns, and the interrupted publish writes the record again."""

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
        buf, words, seqv, ring = self.buf, self._words, self._seqv, self._ring
        hotv, hotq = self._hotv, self._hotq
        mono = time.monotonic_ns
        pack_hot, pack_cold = _HOT.pack_into, _COLD.pack_into
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
            pack_cold(buf, OFF_COLD, t_phase, last_ckpt, phase, flags, acked, 0)

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
            nonlocal phase, t_phase, flags
            previous = phase
            phase, t_phase = code, mono()
            if code == PHASE_CHECKPOINT:
                flags |= RANK_FLAG_IN_CHECKPOINT
            publish()
            return previous

        def exit_phase(code: int, previous: int, completed: bool) -> None:
            """Leave phase ``code`` back to ``previous``. A completed checkpoint phase acknowledges
            every request published before it ended (see docs/client.md, "Checkpoint requests")."""
            nonlocal phase, t_phase, flags, acked, last_ckpt, t_mark
            now = mono()
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
            phase, t_phase = previous, now
            publish()

        def set_async_flag(flag: int) -> None:
            """Signal-safe: one aligned 8-byte store outside the seqlock (SIGTERM, exit)."""
            nonlocal async_flags
            async_flags |= flag
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

        def read_control_state() -> ControlState | None:
            got = read_control()
            return None if got is None else ControlState(*got[1])

        # Initial record: static part, cleared ring and dynamic part under one odd sequence.
        seqv[0] = seq
        _STATIC.pack_into(buf, OFF_STATIC, self.pid, self.rank, self.local_rank, self.world_size,
                          now, time.time_ns())  # fmt: skip
        _RING.pack_into(buf, OFF_RING, *([0] * RING))
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
        self.async_flag_set = async_flag_set
        self.should_checkpoint = should_checkpoint
        self.should_stop = should_stop

    def close(self) -> None:
        """Unmap (the file stays for the agent). Later calls on this writer raise ValueError."""
        for view in (self._words, self._seqv, self._hotq, self._hotv, self._ring):
            view.release()
        self.buf.close()
