"""The per-rank shared-memory slot's binary layout, shared by the rank-side writer and the agent.

WHY a file on /dev/shm mapped by both sides: the training rank publishes its progress with plain
memory stores (no syscall on the hot path) and the node agent samples it whenever it likes; the
supervisor answers through a small control area in the same mapping. Stdlib only: imported inside every
training rank and by the agent. ``supervisor.client.slot`` re-exports everything public here.

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
       phase code, rank flags, acked request, checkpoint ms
       (4 x u32; checkpoint ms: total time this process spent
       in checkpoint phases, wraps at 2**32)
176    asynchronous rank flags (u64, one store, no seqlock:     rank
       set from signal handlers); readers OR them into flags
184    restore ms, restores (2 x u32): total time this process  rank
       spent in restore phases (ended ones, wraps at 2**32)
       and how many it ended (``client.phase("restore")``)
256    control sequence (u64): odd while the agent writes       agent
264    control flags (u32), request counter (u32),              agent
       at_step (i64)
384    ring of the last 16 collective waits (16 x u64), written  rank
       outside the seqlock (one aligned store each) by
       ``client.watch_ddp``'s comm hook and ``client.waiting()``:
       entry (b - 1) % 16 holds the beat number b it belongs to
       (low 24 bits) << 40 | ns beat b spent waiting for peers
       (low 40 bits); only meaningful with RANK_FLAG_WAITS set
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

Own time (what the straggler detector compares): in synchronous data parallelism every rank's step
period is the slowest rank's, because the others wait for it inside the gradient all-reduce. A rank
with ``RANK_FLAG_WAITS`` stamps, outside ``client.step()``, how long each step waited in collectives
(the wait ring); the reader derives the rank's own time per step = step time - wait, over the last 16
steps. The wait ring and the flag sit in bytes that layout 1 left reserved (zero), so older readers
ignore them and older writers never claim them: the layout version stays 1. The restore record (184) is the same
kind of addition: written inside the rank seqlock with the cold part; an older writer leaves it zero (no restore).

Times are ``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns``), system-wide on Linux, so the
agent on the same node compares them with its own clock to get ages.
"""

from __future__ import annotations

import os
import signal
import stat
import struct
from pathlib import Path
from typing import NamedTuple

MAGIC = b"SUPVSLOT"
LAYOUT_VERSION = 1
SLOT_SIZE = 1024

# Phase codes are indexes into PHASES; never reorder, only append (and bump LAYOUT_VERSION if the
# meaning of an existing code changes).
PHASES: tuple[str, ...] = ("init", "step", "checkpoint", "eval", "restore", "data", "other")
PHASE_CODES: dict[str, int] = {name: code for code, name in enumerate(PHASES)}
PHASE_INIT, PHASE_STEP, PHASE_CHECKPOINT, PHASE_EVAL, PHASE_RESTORE = 0, 1, 2, 3, 4

# Control flags, written by the agent/supervisor.
FLAG_CHECKPOINT = 1 << 0  # please checkpoint (at or after ``at_step``)
FLAG_STOP = 1 << 1  # please checkpoint, then stop

# Rank flags, written by the rank.
RANK_FLAG_SIGTERM = 1 << 0  # the rank received SIGTERM
RANK_FLAG_IN_CHECKPOINT = 1 << 1  # the rank is inside a ``phase("checkpoint")`` block
RANK_FLAG_STACK_DUMPS = 1 << 2  # STACK_DUMP_SIGNAL is handled: safe to send (else it kills the rank)
RANK_FLAG_EXITING = 1 << 3  # the interpreter is shutting down normally (atexit ran)
RANK_FLAG_WAITS = 1 << 4  # the rank stamps its collective waits in the wait ring (own time is known)
RANK_FLAG_RESTARTABLE = 1 << 5  # the rank trains inside ``client.restartable``: it can restart in its process
RANK_FLAG_AWAITING_RESTART = 1 << 6  # its training raised; it waits for the supervisor's restart order (no hang)
RANK_FLAG_RETURNED = 1 << 7  # its ``client.restartable`` function returned: this rank's training ended well
RANK_FLAG_PEER_FAILED = 1 << 8  # with AWAITING_RESTART: what it raised was a collective's failure (a peer died,
#                                 hung past the backend's timeout or closed the connection), not its own error
RANK_FLAG_ENDED_CLEAN = 1 << 9  # with EXITING: no unhandled exception when atexit ran (the program's main ended;
#                                 a crash after this, in the interpreter's teardown, lost no training)

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
_RESTORE = struct.Struct("<II")  # restore ms, restores

OFF_HEADER = 0
OFF_RANK_SEQ = 64
OFF_STATIC = OFF_RANK_SEQ + _SEQ.size  # 72
OFF_HOT = OFF_STATIC + _STATIC.size  # 104
OFF_COLD = OFF_HOT + _HOT.size  # 144
OFF_ASYNC_FLAGS = OFF_COLD + _COLD.size  # 176
OFF_RESTORE = OFF_ASYNC_FLAGS + 8  # 184
OFF_CONTROL_SEQ = 256
OFF_CONTROL = OFF_CONTROL_SEQ + _SEQ.size  # 264
OFF_WAITS = 384
WAIT_RING = 16  # collective waits kept; a power of two
WAIT_TAG_SHIFT = 40  # an entry is (beat number & WAIT_TAG_MASK) << 40 | wait ns (< 2**40: 18 minutes)
WAIT_NS_MASK = (1 << WAIT_TAG_SHIFT) - 1
WAIT_TAG_MASK = (1 << 24) - 1
_WAITS = struct.Struct(f"<{WAIT_RING}Q")
OFF_RING = 512
assert OFF_ASYNC_FLAGS % 8 == 0 and OFF_RESTORE + _RESTORE.size <= OFF_CONTROL_SEQ
assert OFF_CONTROL + _CONTROL.size <= OFF_WAITS and OFF_WAITS + _WAITS.size <= OFF_RING
assert OFF_RING + _RING.size <= SLOT_SIZE

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
    ckpt_ms: int = 0  # milliseconds this process spent in checkpoint phases (ended ones), modulo 2**32
    # Own time per step (step time less the time it waited for peers in collectives), for the steps among
    # the last WAIT_RING that have a step time; empty unless the rank sets RANK_FLAG_WAITS.
    recent_own_ns: tuple[int, ...] = ()
    own_ewma_ns: int = 0  # EWMA (alpha 1/8, integer) over recent_own_ns; 0 if empty
    # Time this process spent loading its state (``phase("restore")`` blocks that ended, outermost only), modulo
    # 2**32 ms, and how many such blocks ended: what splits a restart's start-up into state load and the rest.
    restore_ms: int = 0
    restores: int = 0

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


def _recent_own(ring: tuple[int, ...], waits: tuple[int, ...], beats: int) -> tuple[int, ...]:
    """Own time of each of the last WAIT_RING beats that has a step time: the step time less the wait
    stamped for that very beat (an entry tagged with another beat number is stale: no wait that step)."""
    out = []
    for b in range(max(2, beats - WAIT_RING + 1), beats + 1):
        t = ring[(b - 1) % RING]
        if t <= 0:
            continue
        entry = waits[(b - 1) % WAIT_RING]
        wait = entry & WAIT_NS_MASK if entry >> WAIT_TAG_SHIFT == b & WAIT_TAG_MASK else 0
        out.append(max(0, t - wait))
    return tuple(out)


def wait_entry(beat: int, wait_ns: int) -> int:
    """The wait ring's word for ``wait_ns`` spent waiting during beat number ``beat`` (1-based)."""
    return (beat & WAIT_TAG_MASK) << WAIT_TAG_SHIFT | max(0, min(wait_ns, WAIT_NS_MASK))


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
