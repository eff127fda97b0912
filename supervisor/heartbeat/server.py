"""The UDP adapter around ``LiveTable``: receive summaries, send keepalives and commands to the node agents,
and keep ``live.json`` fresh for ``supervise status``.

Drive it with ``poll(timeout)`` from the supervisor's own loop, or ``serve(stop_event)`` in a thread.
"""

from __future__ import annotations

import heapq
import itertools
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from supervisor import paths
from supervisor.heartbeat import wire
from supervisor.heartbeat.live import live_document, write_private_json
from supervisor.heartbeat.secret import create_secret, ensure_private_dir
from supervisor.heartbeat.table import ABNORMAL_NAMES, LiveTable, NodeView, RankView, Snapshot

ADDR_NAME = paths.ADDRESS_NAME
LIVE_NAME = paths.LIVE_NAME


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
            bad.extend(v for v in views if v.state in ABNORMAL_NAMES)
            oldest = heapq.nlargest(limit, itertools.chain(oldest, (v for v in views if v.state not in ABNORMAL_NAMES)),
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
