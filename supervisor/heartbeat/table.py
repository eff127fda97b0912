"""The live per-node / per-rank table the detectors read: authenticated frames in, snapshots out.

Why this shape: at 16,384 nodes x 8 ranks at 1 Hz the hot path must cost a few microseconds per frame,
so a frame is authenticated, its header parsed, and its rank body kept as bytes in the node's entry;
ranks are decoded only when a snapshot is taken.  Beat ages are computed by the agent (same host, same
CLOCK_MONOTONIC as the rank) and aged here by our own clock since receipt, so no clock offset between
hosts enters any age.  Rates use the agent's monotonic send times of two frames >= ``rate_window_s`` apart.

Pure: no sockets, no files; clocks are injectable.  ``server.AggregatorServer`` is the UDP adapter around it,
``live`` writes its ``live.json`` view.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from supervisor import procstate
from supervisor.decisions.memory_pick import Held
from supervisor.heartbeat import wire
from supervisor.heartbeat.memory_report import parse_memory_report

ABNORMAL_NAMES = procstate.ABNORMAL


@dataclass(slots=True)
class _Node:
    node: str
    addr: Any
    recv_mono: float
    recv_wall_ns: int
    sent_wall_ns: int
    sent_mono_ns: int
    seq: int
    body: bytes
    frames: int = 1
    base_body: bytes | None = None  # a frame >= rate_window_s older than `pending`, for rates
    base_mono_ns: int = 0
    pending_body: bytes | None = None
    pending_mono_ns: int = 0


class RankView(NamedTuple):
    """One rank as the supervisor last saw it: what the table produces and every detector reads.

    A NamedTuple because 131k of them are built per snapshot.  Ages are seconds measured by the supervisor.
    Only ``rank`` and ``node`` are required, so detectors' tests and simulations can build views by hand.
    """

    rank: int
    node: str
    pid: int = 0  # 0: no process known (as on the wire)
    step: int | None = None  # None: no step reported (hand-built views; the table always has the slot's step)
    phase: str | None = None  # "init", "step", "checkpoint", ... None: unknown
    beat_age_s: float | None = None  # None: the rank never beat (it does not use the client)
    state: str = procstate.UNKNOWN  # process state, a name from ``supervisor.procstate``
    ewma_s: float | None = None  # the client's iteration-time EWMA; None before the first timed iteration
    min_s: float | None = None  # fastest / slowest iteration in the client's window; None before one
    max_s: float | None = None
    loss: float | None = None  # the last loss given (NaN/Inf kept: the NaN detector needs them); None: none given
    loss_step: int = -1  # the step of ``loss``; -1 when no loss was ever given
    exit_code: int | None = None  # when the agent saw the process end with a known code
    exit_signal: int | None = None  # the signal that killed it, when known
    steps_per_s: float | None = None  # step deltas over the rate window; None until two frames are that far apart
    ewma_steps_per_s: float | None = None  # 1 / ewma_s
    beats: int = 0
    cpu_s: float = 0.0
    cpu_frac: float | None = None  # CPU seconds per wall second over the rate window (progress of a silent rank)
    rank_flags: int = 0
    control_flags: int = 0
    ckpt_ms: int = 0  # time this process spent in checkpoint phases, measured by the client (ms, mod 2**32)
    ckpt_step: int = -1  # the step at the end of its last checkpoint phase; -1: none yet
    own_s: float | None = None  # own time per step (EWMA, collective waits excluded); None: not measured
    restore_ms: int = 0  # time this process spent loading its state in restore phases (client-measured, mod 2**32)
    restores: int = 0  # how many restore phases it ended; 0: none marked (the program does not say, or has not yet)

    @property
    def exit_status(self) -> int | None:
        """The shell's convention in one number: minus the signal when killed by one, else the exit code."""
        return -self.exit_signal if self.exit_signal else self.exit_code


class NodeView(NamedTuple):
    node: str
    staleness_s: float  # our clock since the last summary arrived
    rank_count: int
    frames: int
    seq: int
    lag_s: float  # receive wall time - send wall time (transit + clock offset)
    addr: str


@dataclass(frozen=True)
class Snapshot:
    taken_wall: float
    job: str
    nodes: dict[str, NodeView]
    ranks: list[RankView]
    counters: dict[str, int]
    events: list[dict[str, Any]] = field(default_factory=list)


def _phase_names() -> tuple[str, ...]:
    try:
        from supervisor.client.slot import PHASES  # tiny stdlib module

        return tuple(PHASES)
    except (ImportError, AttributeError):
        return ()


PHASE_NAMES = _phase_names()
_PHASE = PHASE_NAMES + tuple(f"phase{i}" for i in range(len(PHASE_NAMES), 256))
_STATE = tuple(procstate.name(i) for i in range(256))


class LiveTable:
    """Pure core: authenticated frames in, snapshots out.  No sockets, no files; clocks are injectable."""

    def __init__(self, key: bytes, job: str, *, rate_window_s: float = 3.0, replay_window_s: float = 60.0,
                 mono: Callable[[], float] = time.monotonic, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.key, self.job = key, job
        self.rate_window_ns = int(rate_window_s * 1e9)
        self.guard = wire.ReplayGuard(window_s=replay_window_s)
        self.nodes: dict[str, _Node] = {}
        self.counters: Counter[str] = Counter()
        self.events: deque[dict[str, Any]] = deque(maxlen=1000)
        # Each node's newest health report (EVENT_HEALTH) with our wall time of receipt; kept apart from
        # ``events`` so a report per node every 30 s never pushes stack results out of that bounded queue.
        self.health: dict[str, tuple[float, wire.HealthReport]] = {}
        self.health_refused = 0  # authenticated health events whose text is not a report
        # Each node's newest memory-store inventory (EVENT_MEMORY) with our wall time of receipt (the memory tier).
        self.memory: dict[str, tuple[float, tuple[Held, ...]]] = {}
        self.memory_refused = 0
        self.replication: dict[str, str] = {}  # node -> where its agent receives other agents' shards ("host:port")
        self.memory_off: dict[str, tuple[tuple[int, int], ...]] = {}  # node -> (rank, errno) its store failed
        self._mono, self._wall_ns = mono, wall_ns

    def feed(self, data: bytes, addr: Any = None) -> bool:
        """Take one datagram; count it as ok or by refusal reason.  Never raises on bad input."""
        try:
            frame = wire.decode(self.key, data, self.job)
        except wire.FrameError as err:
            self.counters["rejected_" + err.reason] += 1
            return False
        if frame.kind in (wire.KIND_CONTROL, wire.KIND_ORDER):  # the supervisor's own kinds: never from an agent
            self.counters["rejected_kind"] += 1
            return False
        now_wall = self._wall_ns()
        why = self.guard.check(frame.node, frame.instance, frame.seq, frame.sent_wall_ns, now_wall)
        if why is not None:
            self.counters["rejected_" + why] += 1
            return False
        self.counters["ok"] += 1
        if frame.kind == wire.KIND_EVENT:
            for ev in wire.events(frame):
                if ev.kind == wire.EVENT_HEALTH:
                    try:
                        self.health[frame.node] = (now_wall / 1e9, wire.parse_health(ev.text))
                    except wire.FrameError:  # the frame itself was fine (counted ok): only this report is dropped
                        self.health_refused += 1
                    continue
                if ev.kind == wire.EVENT_MEMORY:
                    try:
                        held, listen, off = parse_memory_report(ev.text)
                        self.memory[frame.node] = (now_wall / 1e9, held)
                        if listen:
                            self.replication[frame.node] = listen
                        if off:
                            self.memory_off[frame.node] = off
                    except wire.FrameError:
                        self.memory_refused += 1
                    continue
                name = wire.EVENT_NAMES[ev.kind] if ev.kind < len(wire.EVENT_NAMES) else f"event{ev.kind}"
                self.events.append({"node": frame.node, "rank": ev.rank, "event": name, "text": ev.text,
                                    "wall": now_wall / 1e9})
            return True
        self._store(frame, addr, now_wall)
        return True

    def _store(self, frame: wire.Frame, addr: Any, now_wall: int) -> None:
        st = self.nodes.get(frame.node)
        mono = frame.sent_mono_ns
        if st is None:
            st = self.nodes[frame.node] = _Node(frame.node, addr, self._mono(), now_wall, frame.sent_wall_ns, mono,
                                                frame.seq, frame.body, pending_body=frame.body, pending_mono_ns=mono)
            return
        if mono < st.sent_mono_ns:  # agent restarted (maybe after a reboot): rates start over
            st.base_body = None
            st.pending_body, st.pending_mono_ns = frame.body, mono
        elif mono - st.pending_mono_ns >= self.rate_window_ns:
            st.base_body, st.base_mono_ns = st.pending_body, st.pending_mono_ns
            st.pending_body, st.pending_mono_ns = frame.body, mono
        st.addr, st.recv_mono, st.recv_wall_ns = addr, self._mono(), now_wall
        st.sent_wall_ns, st.sent_mono_ns, st.seq, st.body = frame.sent_wall_ns, mono, frame.seq, frame.body
        st.frames += 1

    def node_views(self, nodes: Iterable[str] | None = None) -> dict[str, NodeView]:
        now = self._mono()
        states = self.nodes.values() if nodes is None else [self.nodes[n] for n in nodes if n in self.nodes]
        return {st.node: NodeView(st.node, now - st.recv_mono, len(st.body) // wire.RANK.size, st.frames, st.seq,
                                  (st.recv_wall_ns - st.sent_wall_ns) / 1e9, _addr_text(st.addr))
                for st in states}

    def rank_views(self, nodes: Iterable[str] | None = None) -> list[RankView]:
        """Decode the last frame of every node (or of ``nodes``): the only per-rank work, a few us per rank.
        Pass slices of node names to spread a big table's decoding between receive bursts."""
        now = self._mono()
        out: list[RankView] = []
        append, unpack, no_beat, unknown = out.append, wire.RANK.iter_unpack, wire.NO_BEAT, wire.EXIT_UNKNOWN
        isfinite = math.isfinite
        states = self.nodes.values() if nodes is None else [self.nodes[n] for n in nodes if n in self.nodes]
        for st in states:
            node, since = st.node, now - st.recv_mono
            base: dict[int, tuple[Any, ...]] = {}
            span = 0.0
            if st.base_body is not None:
                span = (st.sent_mono_ns - st.base_mono_ns) / 1e9
                base = {t[0]: t for t in unpack(st.base_body)}
            for (rank, pid, step, phase, state, rflags, cflags, age, ewma, mn, mx, loss, loss_step, beats, ecode,
                 esig, rflags_hi, cpu, ckpt_ms, ckpt_step, own, restore_ms, restores) in unpack(st.body):
                rflags |= rflags_hi << 8
                rate = cpu_frac = None
                b = base.get(rank)
                if b is not None and span > 0 and b[1] == pid and step >= b[2]:
                    rate = (step - b[2]) / span
                    cpu_frac = max(0.0, cpu - b[17]) / span
                append(RankView(
                    rank, node, pid, step, _PHASE[phase], None if age == no_beat else age / 1000.0 + since,
                    _STATE[state], ewma if ewma > 0 else None, mn if mn > 0 else None, mx if mx > 0 else None,
                    None if loss_step < 0 else loss, loss_step, None if ecode == unknown else ecode, esig or None,
                    rate, 1.0 / ewma if ewma > 0 and isfinite(ewma) else None, beats, cpu, cpu_frac, rflags, cflags,
                    ckpt_ms, ckpt_step, own if own > 0 and isfinite(own) else None, restore_ms, restores))
        return out

    def snapshot(self) -> Snapshot:
        return Snapshot(self._wall_ns() / 1e9, self.job, self.node_views(), self.rank_views(),
                        dict(self.counters), list(self.events))


def _addr_text(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr or "")
