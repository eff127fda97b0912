"""Receive node summaries and keep the live per-node / per-rank table the detectors read.

Why this shape: at 16,384 nodes x 8 ranks at 1 Hz the hot path must cost a few microseconds per frame,
so a frame is authenticated, its header parsed, and its rank body kept as bytes in the node's entry;
ranks are decoded only when a snapshot is taken.  Beat ages are computed by the agent (same host, same
CLOCK_MONOTONIC as the rank) and aged here by our own clock since receipt, so no clock offset between
hosts enters any age.  Rates use the agent's monotonic send times of two frames >= ``rate_window_s`` apart.

``LiveTable`` is the pure core (feed frames, take snapshots); ``AggregatorServer`` is the thin UDP adapter
that also sends keepalives/commands to agents and writes ``live.json`` for ``supervise status``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import secrets
import select
import socket
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from supervisor.heartbeat import wire
from supervisor.heartbeat.secret import create_secret, ensure_private_dir

LIVE_NAME = "live.json"
ADDR_NAME = "aggregator.json"
LIVE_SCHEMA = 1
ABNORMAL = frozenset((wire.ST_STOPPED, wire.ST_ZOMBIE, wire.ST_GONE, wire.ST_EXITED, wire.ST_NO_PID))


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
    """One rank as last reported (a NamedTuple: 131k of them are built per snapshot)."""


    node: str
    rank: int
    pid: int
    step: int
    phase: str
    state: str
    beat_age_s: float | None
    steps_per_s: float | None  # from step deltas over the rate window; None until two frames are that far apart
    ewma_steps_per_s: float | None  # 1 / the client's iteration-time EWMA
    ewma_s: float
    min_s: float
    max_s: float
    loss: float
    loss_step: int  # -1: the rank never gave a loss (``loss`` is then a meaningless NaN)
    beats: int
    cpu_s: float
    cpu_frac: float | None  # CPU seconds per wall second over the rate window (progress of a silent rank)
    rank_flags: int
    control_flags: int
    exit_code: int | None
    exit_signal: int | None


class NodeView(NamedTuple):
    node: str
    staleness_s: float  # our clock since the last summary arrived
    ranks: int
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
_STATE = tuple(wire.STATES) + tuple(f"state{i}" for i in range(len(wire.STATES), 256))


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
        self._mono, self._wall_ns = mono, wall_ns

    def feed(self, data: bytes, addr: Any = None) -> bool:
        """Take one datagram; count it as ok or by refusal reason.  Never raises on bad input."""
        try:
            frame = wire.decode(self.key, data, self.job)
        except wire.FrameError as err:
            self.counters["rejected_" + err.reason] += 1
            return False
        if frame.kind == wire.KIND_CONTROL:
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
                 esig, cpu) in unpack(st.body):
                rate = cpu_frac = None
                b = base.get(rank)
                if b is not None and span > 0 and b[1] == pid and step >= b[2]:
                    rate = (step - b[2]) / span
                    cpu_frac = max(0.0, cpu - b[16]) / span
                append(RankView(
                    node, rank, pid, step, _PHASE[phase], _STATE[state],
                    None if age == no_beat else age / 1000.0 + since, rate,
                    1.0 / ewma if ewma > 0 and isfinite(ewma) else None, ewma, mn, mx, loss, loss_step, beats, cpu,
                    cpu_frac,
                    rflags, cflags, None if ecode == unknown else ecode, esig or None))
        return out

    def snapshot(self) -> Snapshot:
        return Snapshot(self._wall_ns() / 1e9, self.job, self.node_views(), self.rank_views(),
                        dict(self.counters), list(self.events))


def _addr_text(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr or "")


def _num(x: float | None, digits: int = 3) -> float | None:
    """JSON-safe number: NaN/Inf become strings would break readers, so they become None (loss keeps text)."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits)


def _worst(items: list[Any], limit: int, abnormal: Callable[[Any], bool], age: Callable[[Any], float]) -> list[Any]:
    """Everything if it fits, else abnormal items first, then the oldest."""
    if len(items) <= limit:
        return items
    bad = [x for x in items if abnormal(x)]
    if len(bad) >= limit:
        return heapq.nlargest(limit, bad, key=age)
    good = [x for x in items if not abnormal(x)]
    return bad + heapq.nlargest(limit - len(bad), good, key=age)


def worst_ranks(ranks: list[RankView], limit: int) -> list[RankView]:
    return _worst(ranks, limit, lambda r: r.state in _ABNORMAL_NAMES, lambda r: r.beat_age_s or 0.0)


def live_document(snap: Snapshot, *, max_rank_rows: int = 4096, max_node_rows: int = 2048,
                  selected: list[RankView] | None = None) -> dict[str, Any]:
    """The ``live.json`` content: every rank and node up to the row limits, beyond them the worst first
    (abnormal states, oldest beats, stalest nodes), so a 131k-rank job still writes a small file that
    shows what matters.  ``selected``: the rank rows, if already chosen with ``worst_ranks``."""
    ranks = worst_ranks(snap.ranks, max_rank_rows) if selected is None else selected
    nodes = _worst(list(snap.nodes.values()), max_node_rows, lambda n: False, lambda n: n.staleness_s)
    rows = []
    for r in sorted(ranks, key=lambda r: r.rank):
        d = r._asdict()
        for k in ("beat_age_s", "steps_per_s", "ewma_steps_per_s", "ewma_s", "min_s", "max_s", "cpu_s", "cpu_frac"):
            d[k] = _num(d[k])
        d["loss"] = _num(r.loss, 6) if math.isfinite(r.loss) else repr(r.loss)
        rows.append(d)
    return {
        "schema": LIVE_SCHEMA, "job": snap.job, "written_wall": snap.taken_wall,
        "nodes_total": len(snap.nodes),
        "nodes": [{"node": n.node, "staleness_s": _num(n.staleness_s), "ranks": n.ranks, "frames": n.frames,
                   "seq": n.seq, "lag_s": _num(n.lag_s), "addr": n.addr} for n in sorted(nodes, key=lambda n: n.node)],
        "ranks_total": len(snap.ranks), "ranks": rows, "counters": snap.counters, "events": snap.events[-50:],
    }


_ABNORMAL_NAMES = frozenset(wire.STATES[s] for s in ABNORMAL)


def write_private_json(path: Path, doc: dict[str, Any]) -> None:
    """Atomically replace ``path`` with ``doc`` (0600).  No fsync: a live view, rewritten every second."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc, separators=(",", ":"), allow_nan=False))  # one C-encoder pass, one write
    os.replace(tmp, path)


class AggregatorServer:
    """UDP adapter around ``LiveTable``: receive summaries, send keepalives/commands, write ``live.json``.

    Drive it with ``poll(timeout)`` from the supervisor's own loop, or ``serve(stop_event)`` in a thread.
    """

    def __init__(self, campaign: str | os.PathLike[str], job: str, *, bind: tuple[str, int] = ("127.0.0.1", 0),
                 secret: bytes | None = None, live_interval_s: float = 1.0, keepalive_interval_s: float = 5.0,
                 rate_window_s: float = 3.0, max_rank_rows: int = 4096, rcvbuf: int = 64 << 20) -> None:
        self.campaign = ensure_private_dir(campaign)
        self.key = wire.derive_key(secret if secret is not None else create_secret(self.campaign))
        self.table = LiveTable(self.key, job, rate_window_s=rate_window_s)
        self.job = job
        self.live_interval_s, self.keepalive_interval_s = live_interval_s, keepalive_interval_s
        self.max_rank_rows = max_rank_rows
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        for opt in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
            if opt is None:
                continue
            try:  # bursts from 16k agents need a deep queue; FORCE works as root, else capped at rmem_max
                self.sock.setsockopt(socket.SOL_SOCKET, opt, rcvbuf)
                break
            except OSError:
                continue
        self.sock.bind(bind)
        self.sock.setblocking(False)
        self.instance = secrets.randbits(64)
        self.seq = 0
        self._next_live = self._next_keepalive = 0.0
        self._live_job: Iterator[None] | None = None
        # The last snapshot built slice by slice for live.json: detectors should read this instead of calling
        # table.snapshot(), which decodes a 131k-rank table in one go (~0.5 s without receiving).
        self.latest: Snapshot | None = None
        self._live_cost = 0.0
        self._keepalive_queue: list[str] = []
        self.live_write_s = 0.0  # cost of the last live.json write, for benches

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def write_address_file(self) -> Path:
        path = self.campaign / ADDR_NAME
        write_private_json(path, {"host": self.address[0], "port": self.address[1], "pid": os.getpid(),
                                  "job": self.job})
        return path

    def drain(self, limit: int = 100_000) -> int:
        """Feed every queued datagram (up to ``limit``); return how many were read."""
        recv, feed = self.sock.recvfrom, self.table.feed
        n = 0
        while n < limit:
            try:
                data, addr = recv(wire.MAX_FRAME + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ECONNREFUSED echoes of ICMP errors: nothing to read
                break
            feed(data, addr)
            n += 1
        return n

    def poll(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for frames, feed them, then do one slice of due housekeeping.

        Housekeeping (keepalives, the live.json snapshot) is cut into slices of a few ms so a 16k-node
        table never stops the receive loop long enough to overflow the socket buffer.
        """
        busy = self._live_job is not None or bool(self._keepalive_queue)
        ready, _, _ = select.select([self.sock], [], [], 0.0 if busy else max(0.0, timeout))
        n = self.drain() if ready else 0
        now = time.monotonic()
        if now >= self._next_keepalive and not self._keepalive_queue:
            self._next_keepalive = now + self.keepalive_interval_s
            self._keepalive_queue = list(self.table.nodes)
        if self._keepalive_queue:
            batch, self._keepalive_queue = self._keepalive_queue[-256:], self._keepalive_queue[:-256]
            for node in batch:
                self.send(node, [wire.Command(wire.CMD_KEEPALIVE)])
        if self._live_job is None and now >= self._next_live:
            self._live_job, self._live_cost = self._live_steps(), 0.0
        if self._live_job is not None:
            t0 = time.perf_counter()
            try:
                next(self._live_job)
                self._live_cost += time.perf_counter() - t0
            except StopIteration:
                self._live_cost += time.perf_counter() - t0
                self._live_job, self.live_write_s = None, self._live_cost
                # Keep the live file's cost under ~10% of a core even for huge tables.
                self._next_live = time.monotonic() + max(self.live_interval_s, 10 * self.live_write_s)
        return n

    def _live_steps(self, chunk: int = 256) -> Iterator[None]:
        """Build ``latest`` and write live.json in slices; the worst-rank selection is folded into the slices."""
        table, limit = self.table, self.max_rank_rows
        names = list(table.nodes)
        ranks: list[RankView] = []
        bad: list[RankView] = []
        oldest: list[RankView] = []  # the `limit` oldest-beat normal ranks so far, oldest first

        def age(r: RankView) -> float:
            return r.beat_age_s or 0.0

        for i in range(0, len(names), chunk):
            views = table.rank_views(names[i:i + chunk])
            ranks.extend(views)
            bad.extend(v for v in views if v.state in _ABNORMAL_NAMES)
            oldest = heapq.nlargest(limit, itertools.chain(oldest, (v for v in views if v.state not in _ABNORMAL_NAMES)),
                                    key=age)
            yield
        nodes: dict[str, NodeView] = {}
        for i in range(0, len(names), 8 * chunk):
            nodes.update(table.node_views(names[i:i + 8 * chunk]))
            yield
        self.latest = snap = Snapshot(time.time(), self.job, nodes, ranks, dict(table.counters), list(table.events))
        if len(ranks) <= limit:
            selected = ranks
        elif len(bad) >= limit:
            selected = heapq.nlargest(limit, bad, key=age)
        else:
            selected = bad + oldest[:limit - len(bad)]
        doc = live_document(snap, max_rank_rows=limit, selected=selected)
        yield
        write_private_json(self.campaign / LIVE_NAME, doc)

    def write_live(self) -> Snapshot:
        """Snapshot and write live.json now, in one go."""
        t0 = time.perf_counter()
        snap = self.latest = self.table.snapshot()
        write_private_json(self.campaign / LIVE_NAME, live_document(snap, max_rank_rows=self.max_rank_rows))
        self.live_write_s = time.perf_counter() - t0
        return snap

    def send(self, node: str, cmds: Sequence[wire.Command]) -> bool:
        """Send commands to one node's agent; False if that node never reported (no address yet)."""
        st = self.table.nodes.get(node)
        if st is None or not isinstance(st.addr, tuple):
            return False
        self.seq += 1
        frame = wire.encode_control(self.key, instance=self.instance, seq=self.seq, wall_ns=time.time_ns(),
                                    mono_ns=time.monotonic_ns(), job=self.job, node=node, commands=cmds)
        try:
            self.sock.sendto(frame, st.addr)
        except OSError:
            self.table.counters["send_errors"] += 1
            return False
        return True

    def serve(self, stop: threading.Event, tick_s: float = 0.1) -> None:
        while not stop.is_set():
            self.poll(tick_s)

    def close(self) -> None:
        self.sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m supervisor.heartbeat.aggregator``: a standalone aggregator (used by tests and benches)."""
    p = argparse.ArgumentParser(prog="python -m supervisor.heartbeat.aggregator", description=__doc__.splitlines()[0])
    p.add_argument("--campaign", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0 = any)")
    p.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0 = never)")
    args = p.parse_args(argv)
    host, _, port = args.bind.rpartition(":")
    server = AggregatorServer(args.campaign, args.job_id, bind=(host or "127.0.0.1", int(port)))
    path = server.write_address_file()
    print(f"aggregator listening on {server.address[0]}:{server.address[1]} ({path})", flush=True)
    deadline = time.monotonic() + args.duration if args.duration > 0 else math.inf
    try:
        while time.monotonic() < deadline:
            server.poll(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
