"""The memory tier's copies between node agents (agent/replication*.py, agent/replica_store.py) over real
loopback sockets: a node's newest snapshot reaches its buddy verified, a fetch order places a shard in another
node's own store, and a peer without this run's key, a forged or replayed frame, a payload that does not match
its authenticated digest, or any malformed header or order is refused with nothing stored."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.agent import replica_store
from supervisor.agent.memory_inventory import Inventory
from supervisor.agent.replication import Pacer, Receiver, Sender
from supervisor.agent.replication_wire import (
    ReplicationError,
    ShardHeader,
    accept_handshake,
    connect_handshake,
    parse_shard,
)
from supervisor.checkpoint.snapshot_format import Header, TensorLeaf, encode_header
from supervisor.heartbeat.orders import Fetch, OrderError, Peer, fetch_order, parse_orders

KEY = b"k" * 32


def shard(root: Path, step: int, rank: int, world: int = 2, launch: str = "9-0-1", fill: int = 1) -> Path:
    """A valid shard as a rank writes it (header, payload, then its record), without torch."""
    payload = bytes([fill]) * 256
    head = encode_header(Header(step, rank, world, (TensorLeaf((("k", "w"),), "uint8", (256,), 0, 256, False),), 256))
    data = head + payload
    folder = root / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.snap").write_bytes(data)
    (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step, "rank": rank, "world": world, "size": len(data),
                                                          "sha256": hashlib.sha256(data).hexdigest(), "launch": launch}))
    return folder / f"rank_{rank}.snap"


def wait_until(what, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("timed out")


@pytest.fixture
def receiver(tmp_path: Path):  # type: ignore[no-untyped-def]
    rx = Receiver(tmp_path / "n2", KEY, job="9", node="n2", host="127.0.0.1")
    (tmp_path / "n2").mkdir()
    rx.start()
    yield rx
    rx.close()


def test_a_nodes_newest_snapshot_reaches_its_buddy_verified(tmp_path: Path, receiver: Receiver) -> None:
    own = tmp_path / "n1"
    shard(own, 4, 0), shard(own, 5, 0), shard(own, 5, 1)
    tx = Sender(own, KEY, job="9", node="n1", tick_s=0.02)
    tx.start()
    try:
        host, port = receiver.address.rsplit(":", 1)
        tx.set_buddy(Peer("n2", host, int(port)))
        wait_until(lambda: tx.counters["sent"] == 2)
        held = Inventory(tmp_path / "n2").scan()
        assert sorted((h.step, h.rank, h.verified, h.launch) for h in held) == [(5, 0, True, "9-0-1"), (5, 1, True, "9-0-1")]
        assert (tmp_path / "n2" / "replica" / "n1" / "step_5" / "rank_1.snap").is_file()
        time.sleep(0.2)
        assert tx.counters["sent"] == 2  # each shard once per buddy
        shard(own, 6, 0), shard(own, 6, 1)
        wait_until(lambda: tx.counters["sent"] == 4)
        shard(own, 7, 0), shard(own, 7, 1)
        wait_until(lambda: tx.counters["sent"] == 6)
        assert sorted(p.name for p in (tmp_path / "n2" / "replica" / "n1").iterdir()) == ["step_6", "step_7"]
    finally:
        tx.close()


def test_a_fetch_order_places_a_buddys_copy_in_the_new_nodes_own_store(tmp_path: Path, receiver: Receiver) -> None:
    holder = tmp_path / "n3"
    shard(holder / "replica" / "n1", 5, 1)  # n3 holds n1's rank-1 shard as n1's buddy
    tx = Sender(holder, KEY, job="9", node="n3", tick_s=0.02)
    tx.start()
    try:
        host, port = receiver.address.rsplit(":", 1)
        tx.fetch((Fetch(Peer("n2", host, int(port)), 5, 1),))
        wait_until(lambda: (tmp_path / "n2" / "step_5" / "rank_1.json").is_file())
        assert [(h.step, h.rank, h.verified) for h in Inventory(tmp_path / "n2").scan()] == [(5, 1, True)]
    finally:
        tx.close()


def test_a_sender_without_the_key_stores_nothing_and_a_receiver_without_it_gets_nothing(
        tmp_path: Path, receiver: Receiver) -> None:  # fmt: skip
    own = tmp_path / "n1"
    shard(own, 5, 0)
    host, port = receiver.address.rsplit(":", 1)
    wrong = Sender(own, b"x" * 32, job="9", node="n1")
    assert not wrong._send(Peer("n2", host, int(port)), [(own / "step_5" / "rank_0.snap", "replica")])
    wait_until(lambda: receiver.counters["refused_hello"] == 1)
    assert not (tmp_path / "n2" / "replica").exists()
    # Whoever took the port without the key (it accepts any hello and answers anything): gets no shard bytes.
    listener = socket.create_server(("127.0.0.1", 0))
    seen = bytearray()

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"SVR1" + b"n" * 32)
            seen.extend(conn.recv(65536))
            conn.sendall(b"w" * 32)
            conn.settimeout(1.0)
            try:
                while chunk := conn.recv(65536):
                    seen.extend(chunk)
            except OSError:
                pass

    t = threading.Thread(target=impostor)
    t.start()
    right = Sender(own, KEY, job="9", node="n1")
    assert not right._send(Peer("n2", "127.0.0.1", listener.getsockname()[1]),
                           [(own / "step_5" / "rank_0.snap", "replica")])  # fmt: skip
    t.join(5)
    listener.close()
    assert "does not hold this run's key" in right.last_error
    assert b'"kind":"shard"' not in seen and bytes([1]) * 64 not in seen  # the hello only


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_forged_replayed_and_mismatching_frames_are_refused(tmp_path: Path) -> None:
    a, b = _pair()
    out: dict[str, object] = {}

    def serve() -> None:
        session, sender = accept_handshake(b, KEY, job="9", node="n2")
        out["sender"] = sender
        try:
            out["first"] = session.read_header()
            session.read_header()
        except ReplicationError as err:
            out["error"] = str(err)

    t = threading.Thread(target=serve)
    t.start()
    session = connect_handshake(a, KEY, job="9", node="n1", peer="n2")
    session.send_header({"kind": "bye"})
    session.seq -= 1  # the same frame again: its sequence number was used
    session.send_header({"kind": "bye"})
    t.join(5)
    assert out["sender"] == "n1" and out["first"] == {"kind": "bye"} and "MAC refused" in str(out["error"])
    a.close(), b.close()

    root = tmp_path / "store"
    root.mkdir()
    data = b"payload" * 10
    header = ShardHeader("replica", "n1", 3, 0, 1, len(data), hashlib.sha256(b"other").hexdigest(), "")
    assert not replica_store.receive(root, header, iter([data]))  # the bytes are not what was authenticated
    assert not list((root / "replica" / "n1" / "step_3").iterdir())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["kind", "dest", "origin", "step", "rank", "world", "size", "sha256", "launch"]),
                       st.one_of(st.integers(-2, 2**64), st.text(max_size=70), st.none(), st.lists(st.integers()))))
def test_any_shard_header_is_parsed_or_refused_with_the_replication_error(doc: dict[str, object]) -> None:
    try:
        h = parse_shard(doc)
    except ReplicationError:
        return
    assert h.dest in ("replica", "own") and 0 <= h.rank < h.world and h.size > 0 and "/" not in h.origin


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.one_of(st.integers(-3, 2**63), st.text(max_size=30), st.none(), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["buddy", "fetch", "to", "node", "address", "step", "rank",
                                                             "flush", "dir", "shards", "launch"]),
                                            inner)), max_leaves=25).map(json.dumps)))  # fmt: skip
def test_any_order_text_is_parsed_or_refused_with_the_orders_error(text: str) -> None:
    try:
        parse_orders(text)
    except OrderError:
        pass


def test_orders_read_back_and_the_pacer_keeps_the_rate() -> None:
    got = parse_orders(fetch_order([("n3", "127.0.0.1:9", 5, 1)]))
    assert got.fetches == (Fetch(Peer("n3", "127.0.0.1", 9), 5, 1),) and got.buddy is None
    assert parse_orders('{"buddy": null}').no_buddy
    now = [0.0]
    slept: list[float] = []
    pacer = Pacer(100.0, clock=lambda: now[0], sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    for _ in range(5):
        pacer.wait(50)
    assert now[0] == pytest.approx(2.0)  # 250 bytes at 100 B/s: the last chunk may start at 2 s
