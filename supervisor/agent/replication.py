"""The node agent's two halves of the memory tier's copies between nodes (``replication_wire`` for the stream,
``replica_store`` for the files).

:class:`Receiver` listens on the address the node uses to reach the supervisor (its cluster network; loopback on
the local cluster), authenticates each sender, and keeps the shards it is sent: a buddy's copies, or a shard for a
rank about to start on this node. :class:`Sender` copies this node's ranks' newest complete snapshot to its buddy
as soon as it appears (each shard once per buddy), under a bandwidth cap so training traffic keeps its share, and
carries out the supervisor's fetch orders first (a relaunch waits for them). Both run in threads; a peer that
fails or lies is dropped and counted, the agent goes on.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from supervisor.agent import replica_store
from supervisor.agent.replication_wire import (
    OK,
    REFUSED,
    ReplicationError,
    Session,
    ShardHeader,
    accept_handshake,
    connect_handshake,
    parse_shard,
    recv_exact,
)
from supervisor.heartbeat.orders import Fetch, Peer

CONNECT_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 30.0
DEFAULT_CAP_BYTES_S = 2 << 30  # 2 GiB/s: well under a 200-400 Gb/s NIC, so the training's collectives keep theirs
MAX_PEERS = 8  # connections served at once (a node's buddy, and the senders of fetches before a relaunch)


class Receiver:
    def __init__(self, root: Path, key: bytes, *, job: str, node: str, host: str) -> None:
        self.root, self.key, self.job, self.node = root, key, job, node
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.counters: Counter[str] = Counter()
        self.stop = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_PEERS)
        self.thread = threading.Thread(target=self._run, name="agent-replica-recv", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if not ready:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if not self.slots.acquire(blocking=False):
                self.counters["refused_busy"] += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="agent-replica-peer", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            session, sender = accept_handshake(conn, self.key, job=self.job, node=self.node)
            while True:
                doc = session.read_header()
                if doc.get("kind") == "bye":
                    return
                self._shard(session, conn, parse_shard(doc), sender)
        except ReplicationError as err:
            self.counters["refused_" + str(err).split(" ", 1)[0]] += 1
        except OSError:
            self.counters["io_errors"] += 1
        finally:
            conn.close()
            self.slots.release()

    def _shard(self, session: Session, conn: socket.socket, header: ShardHeader, sender: str) -> None:
        if header.dest == "replica" and header.origin != sender:
            raise ReplicationError("replica of another node's ranks")  # a buddy copies only its own node's
        if not replica_store.has_room(self.root, header.size):
            conn.sendall(REFUSED)
            self.counters["refused_room"] += 1
            return
        conn.sendall(OK)
        kept = replica_store.receive(self.root, header, _payload(conn, header.size))
        conn.sendall(OK if kept else REFUSED)
        self.counters["kept" if kept else "refused_digest"] += 1
        if not kept:
            raise ReplicationError("digest mismatch")

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(2.0)
        self.sock.close()


def _payload(conn: socket.socket, size: int) -> Iterator[bytes]:
    left = size
    while left:
        chunk = recv_exact(conn, min(left, 1 << 20))
        left -= len(chunk)
        yield chunk


class Pacer:
    """A token bucket: ``wait(n)`` returns when sending ``n`` more bytes keeps the rate within ``rate`` B/s."""

    def __init__(self, rate: float, clock=time.monotonic, sleep=time.sleep) -> None:  # type: ignore[no-untyped-def]
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.free_at = clock()

    def wait(self, n: int) -> None:
        now = self.clock()
        start = max(now, self.free_at)
        self.free_at = start + n / self.rate
        if start > now:
            self.sleep(start - now)


class Sender:
    def __init__(self, root: Path, key: bytes, *, job: str, node: str, cap_bytes_s: float = DEFAULT_CAP_BYTES_S,
                 tick_s: float = 0.1) -> None:  # fmt: skip
        self.root, self.key, self.job, self.node, self.tick_s = root, key, job, node, tick_s
        self.pacer = Pacer(cap_bytes_s)
        self.counters: Counter[str] = Counter()
        self.buddy: Peer | None = None
        self.sent: set[tuple[str, int, int, str]] = set()  # (buddy, step, rank, shard identity) copied
        self.fetches: list[Fetch] = []
        self.lock = threading.Lock()
        self.stop, self.wake = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="agent-replica-send", daemon=True)
        self.last_error = ""

    def start(self) -> None:
        self.thread.start()

    def set_buddy(self, buddy: Peer | None) -> None:
        with self.lock:
            if buddy != self.buddy:
                self.buddy = buddy
                self.wake.set()

    def fetch(self, orders: tuple[Fetch, ...]) -> None:
        with self.lock:
            self.fetches += [f for f in orders if f not in self.fetches]
        self.wake.set()

    def _run(self) -> None:
        while True:
            self.wake.wait(self.tick_s)
            self.wake.clear()
            if self.stop.is_set():
                return
            try:
                self._fetch_all()
                self._copy_to_buddy()
            except Exception:  # noqa: BLE001 - a copy that fails is retried at the next tick; the agent goes on
                self.counters["errors"] += 1

    def _fetch_all(self) -> None:
        with self.lock:
            todo, self.fetches = self.fetches, []
        by_peer: dict[Peer, list[Fetch]] = {}
        for f in todo:
            by_peer.setdefault(f.to, []).append(f)
        for peer, items in by_peer.items():
            shards = [(s, "own") for f in items if (s := replica_store.find_shard(self.root, f.step, f.rank))]
            self.counters["fetch_missing"] += len(items) - len(shards)
            if shards:
                self._send(peer, shards)

    def _copy_to_buddy(self) -> None:
        with self.lock:
            buddy = self.buddy
        if buddy is None:
            return
        own = replica_store.own_shards(self.root)
        if not own:
            return
        newest = own[0][0]
        todo = []
        for step, rank, shard in own:
            if step != newest:
                break
            ident = _identity(shard)
            if ident and (buddy.node, step, rank, ident) not in self.sent:
                todo.append((shard, (buddy.node, step, rank, ident)))
        if todo and self._send(buddy, [(s, "replica") for s, _ in todo]):
            self.sent = {k for k in self.sent if k[0] == buddy.node and k[1] >= newest} | {key for _, key in todo}

    def _send(self, peer: Peer, shards: list[tuple[Path, str]]) -> bool:
        """Send shards to ``peer`` over one connection; True when every one was kept."""
        try:
            with socket.create_connection((peer.host, peer.port), timeout=CONNECT_TIMEOUT_S) as sock:
                sock.settimeout(IO_TIMEOUT_S)
                session = connect_handshake(sock, self.key, job=self.job, node=self.node, peer=peer.node)
                ok = True
                for shard, dest in shards:
                    ok &= self._send_one(session, sock, shard, dest)
                session.send_header({"kind": "bye"})
                return ok
        except (OSError, ReplicationError) as err:
            self.counters["send_failed"] += 1
            self.last_error = str(err)
            return False

    def _send_one(self, session: Session, sock: socket.socket, shard: Path, dest: str) -> bool:
        record = replica_store.read_record(shard)
        if record is None:
            return False
        origin = str(record.get("origin") or self.node) if dest == "own" else self.node
        header = ShardHeader(dest, origin, int(record["step"]), int(record["rank"]),  # type: ignore[call-overload]
                             int(record["world"]), int(record["size"]), str(record["sha256"]),  # type: ignore[call-overload]
                             str(record.get("launch", "")))  # fmt: skip
        session.send_header(header.to_doc())
        if recv_exact(sock, 1) != OK:
            self.counters["refused_by_peer"] += 1
            return False
        for chunk in replica_store.chunked(shard, pace=self.pacer.wait):
            sock.sendall(chunk)
        kept = recv_exact(sock, 1) == OK
        self.counters["sent" if kept else "refused_by_peer"] += 1
        return kept

    def close(self) -> None:
        self.stop.set()
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(2.0)


def _identity(shard: Path) -> str:
    """What tells two versions of a shard apart without hashing it again: its recorded digest."""
    record = replica_store.read_record(shard)
    return str(record.get("sha256", "")) if record else ""
