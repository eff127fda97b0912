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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from supervisor import paths
from supervisor.errors import ConfigError
from supervisor.heartbeat import wire
from supervisor.heartbeat.live import live_document, write_private_json
from supervisor.heartbeat.secret import create_secret, ensure_private_dir
from supervisor.heartbeat.table import ABNORMAL_NAMES, LiveTable, NodeView, RankView, Snapshot

ADDR_NAME = paths.ADDRESS_NAME
LIVE_NAME = paths.LIVE_NAME
CHANNEL_BYTES = 16
DRAIN_BUDGET_S = 0.02  # one poll reads datagrams for at most this long: a junk flood cannot stall the loop
BIND_ENV = "SUPERVISOR_BIND"
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*", "0:0:0:0:0:0:0:0"})  # noqa: S104 - the ones refused
_BIND_FIX = f"set {BIND_ENV} to this batch host's address on the network the compute nodes use"


class ChannelError(ConfigError):
    """The heartbeat channel cannot be set up so that the agents reach it (exit 3, a configuration problem)."""


def bind_address(override: str | None, node_addr: str | None) -> str:
    """The address the aggregator binds and advertises to the agents: ``override`` (``SUPERVISOR_BIND``) if set,
    else the batch host's Slurm ``NodeAddr`` (None when it could not be read).

    Never a wildcard: a socket bound to 0.0.0.0 listens on every network of the batch host, and the address
    the agents are told must be one they can reach; without a usable address the run stops at once with
    ``ChannelError`` rather than starting agents that could never report."""
    if override is not None and override.strip():
        host = override.strip().strip("[]")
        if host in _WILDCARDS:
            raise ChannelError(f"{BIND_ENV}={override!r} is a wildcard: agents cannot be told to reach it", _BIND_FIX)
        return host
    if node_addr is None:
        raise ChannelError("cannot tell the batch host's address (its Slurm NodeAddr could not be read)", _BIND_FIX)
    host = node_addr.strip().strip("[]")
    if host in _WILDCARDS:
        raise ChannelError(f"the batch host's Slurm NodeAddr is {node_addr!r}, which agents cannot reach", _BIND_FIX)
    return host


def resolve_sources(hosts: Iterable[str | None]) -> frozenset[str] | None:
    """The IP addresses datagrams from ``hosts`` (the allocation's node addresses) arrive from; None when any is
    unknown or does not resolve (then no datagram is dropped by source: nobody is silenced on missing data)."""
    out: set[str] = set()
    for host in hosts:
        if not host:
            return None
        try:
            infos = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_DGRAM)
        except (OSError, UnicodeError):
            return None
        out.update(str(info[4][0]) for info in infos)
    return frozenset(out) or None


class AggregatorServer:
    """UDP adapter around ``LiveTable``: receive summaries, send keepalives/commands, write ``live.json``.

    Drive it with ``poll(timeout)`` from the supervisor's own loop, or ``serve(stop_event)`` in a thread.
    """

    def __init__(self, campaign: str | os.PathLike[str], job: str, *, bind: tuple[str, int] = ("127.0.0.1", 0),
                 secret: bytes | None = None, channel: bytes | None = None, live_interval_s: float = 1.0,
                 keepalive_interval_s: float = 5.0, rate_window_s: float = 3.0, max_rank_rows: int = 4096,
                 rcvbuf: int = 64 << 20, allowed_sources: Iterable[str] | None = None) -> None:
        self.campaign = ensure_private_dir(campaign)
        # A fresh channel value per server (= per Slurm run): mixed into the key, published only in the 0600
        # address file, so frames recorded in an earlier run never authenticate here.  b"": none (tests, benches).
        self.channel = secrets.token_bytes(CHANNEL_BYTES) if channel is None else channel
        self.key = wire.derive_key(secret if secret is not None else create_secret(self.campaign), self.channel)
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
        # Source IPs of the allocation's nodes: other datagrams are dropped before the HMAC. None: unknown.
        self.allowed_sources: frozenset[str] | None = None if allowed_sources is None else frozenset(allowed_sources)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def write_address_file(self) -> Path:
        """Publish the address and this run's channel value to the agents (``CAMPAIGN/aggregator.json``, 0600)."""
        path = self.campaign / ADDR_NAME
        write_private_json(path, {"host": self.address[0], "port": self.address[1], "pid": os.getpid(),
                                  "job": self.job, "channel": self.channel.hex()})
        return path

    def drain(self, budget_s: float = DRAIN_BUDGET_S) -> int:
        """Feed queued datagrams for at most ``budget_s`` seconds; return how many were read.

        Bounded by time, not count: rejecting a junk 65 kB datagram costs ~40 us, so a flood read to the end
        would stall the supervisor's loop for seconds and make real nodes look silent."""
        recv, feed, allowed, counters = self.sock.recvfrom, self.table.feed, self.allowed_sources, self.table.counters
        clock = time.perf_counter
        deadline = clock() + budget_s
        n = 0
        while True:
            if n & 15 == 15 and clock() >= deadline:
                break
            try:
                data, addr = recv(wire.MAX_FRAME + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ECONNREFUSED echoes of ICMP errors: nothing to read
                break
            n += 1
            if allowed is not None and addr[0] not in allowed:
                counters["rejected_source"] += 1
                continue
            feed(data, addr)
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
        return self._send(node, lambda seq: wire.encode_control(
            self.key, instance=self.instance, seq=seq, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
            job=self.job, node=node, commands=cmds))  # fmt: skip

    def send_order(self, node: str, text: str) -> bool:
        """Send one JSON order (``wire.KIND_ORDER``) to one node's agent; False if it never reported."""
        return self._send(node, lambda seq: wire.encode_order(
            self.key, instance=self.instance, seq=seq, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
            job=self.job, node=node, text=text))  # fmt: skip

    def _send(self, node: str, encode: Callable[[int], bytes]) -> bool:
        """One frame, sealed with the next sequence number, to the address ``node``'s agent reported from."""
        st = self.table.nodes.get(node)
        if st is None or not isinstance(st.addr, tuple):
            return False
        self.seq += 1
        frame = encode(self.seq)
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
