"""The authenticated stream between two node agents that carries memory snapshot shards (the memory tier's copy
to a buddy node, and the copy of a shard to the node its rank will run on before a relaunch).

Why its own protocol and not the heartbeat datagrams: a shard is megabytes to gigabytes, sent in order once, so
it goes over one TCP connection; only the metadata is authenticated with a MAC, and the payload is bound to it by
its SHA-256 (carried in the authenticated header, checked by the receiver before the shard exists): one pass of
hashing, which the receiver needs anyway.

Handshake (``key``: derived from this Slurm run's wire key, so it changes with every run):

1. receiver -> sender: ``MAGIC`` + 32 random bytes ``nb``.
2. sender -> receiver: a JSON hello ``{"job", "from", "to", "na"}`` (length-prefixed) + HMAC(key, "hello" nb hello).
3. receiver -> sender: HMAC(key, "welcome" na nb) — the sender checks it: it sends weights only to a peer that
   holds the key (not to whoever took the port).
4. then frames, each a JSON header (length-prefixed) + HMAC(session, seq header) + ``size`` raw bytes, where
   ``session`` = HMAC(key, "session" na nb) and ``seq`` counts from 1: a frame of another connection, or one
   replayed or reordered within it, does not authenticate. The receiver answers each shard with one status byte.

Every length is bounded; every malformed or unauthenticated input raises :class:`ReplicationError` and nothing
else, and the connection is dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"SVR1"
NONCE = 32
MAC = 32
MAX_HEADER = 4096
LENGTH = struct.Struct("<I")
MAX_SHARD = 1 << 40  # 1 TiB: a rank's state on one node is far smaller
DESTS = ("replica", "own")  # a buddy's copy, or a shard placed for the rank that will run on this node
OK, REFUSED = b"\x00", b"\x01"


class ReplicationError(Exception):
    """A peer or frame that is refused (unauthenticated, malformed, too big, or the connection broke)."""


@dataclass(frozen=True)
class ShardHeader:
    """One shard as it travels: the record a rank wrote beside it, where it goes, and from which node."""

    dest: str
    origin: str  # the node whose ranks wrote it
    step: int
    rank: int
    world: int
    size: int
    sha256: str
    launch: str

    def to_doc(self) -> dict[str, Any]:
        return {"kind": "shard", "dest": self.dest, "origin": self.origin, "step": self.step, "rank": self.rank,
                "world": self.world, "size": self.size, "sha256": self.sha256, "launch": self.launch}  # fmt: skip


def replication_key(wire_key: bytes) -> bytes:
    """Domain-separated from the heartbeat wire key of this Slurm run."""
    return hmac.digest(wire_key, b"slurm-supervisor replication v1", hashlib.sha256)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), hashlib.sha256)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except OSError as err:
            raise ReplicationError(f"connection broke: {err}") from None
        if not chunk:
            raise ReplicationError("connection closed")
        buf += chunk
    return bytes(buf)


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError as err:
        raise ReplicationError(f"connection broke: {err}") from None


def _read_json(sock: socket.socket) -> tuple[bytes, dict[str, Any]]:
    (length,) = LENGTH.unpack(recv_exact(sock, LENGTH.size))
    if not 0 < length <= MAX_HEADER:
        raise ReplicationError("header length out of bounds")
    raw = recv_exact(sock, length)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ReplicationError("header is not JSON") from None
    if not isinstance(doc, dict):
        raise ReplicationError("header is not an object")
    return raw, doc


def _framed(doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER:
        raise ReplicationError("header too long")
    return LENGTH.pack(len(raw)) + raw


class Session:
    """One authenticated connection; ``seq`` numbers the frames sent (sender) or expected (receiver)."""

    def __init__(self, sock: socket.socket, key: bytes) -> None:
        self.sock, self.key, self.seq = sock, key, 0

    def send_header(self, doc: dict[str, Any]) -> None:
        self.seq += 1
        framed = _framed(doc)
        _send(self.sock, framed + _mac(self.key, self.seq.to_bytes(8, "little"), framed[LENGTH.size:]))

    def read_header(self) -> dict[str, Any]:
        self.seq += 1
        raw, doc = _read_json(self.sock)
        if not hmac.compare_digest(_mac(self.key, self.seq.to_bytes(8, "little"), raw), recv_exact(self.sock, MAC)):
            raise ReplicationError("frame MAC refused (forged, replayed or reordered)")
        return doc


def accept_handshake(sock: socket.socket, key: bytes, *, job: str, node: str) -> tuple[Session, str]:
    """Receiver side: authenticate the sender; returns the session and the sender's node."""
    nb = secrets.token_bytes(NONCE)
    _send(sock, MAGIC + nb)
    raw, hello = _read_json(sock)
    if not hmac.compare_digest(_mac(key, b"hello", nb, raw), recv_exact(sock, MAC)):
        raise ReplicationError("hello MAC refused (not this run's key)")
    sender, na_hex = hello.get("from"), hello.get("na")
    if hello.get("job") != job or hello.get("to") != node or not isinstance(sender, str) or not sender:
        raise ReplicationError("hello is for another job or node")
    try:
        na = bytes.fromhex(na_hex) if isinstance(na_hex, str) else b""
    except ValueError:
        na = b""
    if len(na) != NONCE:
        raise ReplicationError("hello nonce malformed")
    _send(sock, _mac(key, b"welcome", na, nb))
    return Session(sock, _mac(key, b"session", na, nb)), sender[:255]


def connect_handshake(sock: socket.socket, key: bytes, *, job: str, node: str, peer: str) -> Session:
    """Sender side: prove the key, and check the receiver holds it too."""
    head = recv_exact(sock, len(MAGIC) + NONCE)
    if head[: len(MAGIC)] != MAGIC:
        raise ReplicationError("not a replication receiver")
    nb, na = head[len(MAGIC):], secrets.token_bytes(NONCE)
    framed = _framed({"job": job, "from": node, "to": peer, "na": na.hex()})
    _send(sock, framed + _mac(key, b"hello", nb, framed[LENGTH.size:]))
    if not hmac.compare_digest(_mac(key, b"welcome", na, nb), recv_exact(sock, MAC)):
        raise ReplicationError("the receiver does not hold this run's key")
    return Session(sock, _mac(key, b"session", na, nb))


def parse_shard(doc: dict[str, Any]) -> ShardHeader:
    """An authenticated header's fields, checked; ``ReplicationError`` when any is not as it must be."""
    try:
        h = ShardHeader(doc["dest"], doc["origin"], doc["step"], doc["rank"], doc["world"], doc["size"],
                        doc["sha256"], doc["launch"])  # fmt: skip
    except (KeyError, TypeError):
        raise ReplicationError("shard header incomplete") from None
    ints = (h.step, h.rank, h.world, h.size)
    if doc.get("kind") != "shard" or h.dest not in DESTS or not all(type(x) is int for x in ints):
        raise ReplicationError("shard header malformed")
    if not (0 <= h.step < 1 << 62 and 0 <= h.rank < h.world <= 1 << 24 and 0 < h.size <= MAX_SHARD):
        raise ReplicationError("shard header out of bounds")
    if not isinstance(h.sha256, str) or len(h.sha256) != 64 or not set(h.sha256) <= set("0123456789abcdef"):
        raise ReplicationError("shard digest malformed")
    if not isinstance(h.origin, str) or not 0 < len(h.origin) <= 255 or "/" in h.origin or h.origin in (".", ".."):
        raise ReplicationError("shard origin malformed")
    if not isinstance(h.launch, str) or len(h.launch) > 64:
        raise ReplicationError("shard launch malformed")
    return h
