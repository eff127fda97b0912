"""Fuzzing the heartbeat path's parsers: only their own typed errors may escape (derandomized, bounded).

Targets: wire frames (before and after the MAC: authenticated garbage reaches the parsers too), the live
table and its live.json on whatever passed, slot records a rank (or anyone who can write the slot) left in
shared memory, control messages to the agent, and the agent's address file.  Long runs: bench/fuzz_all.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.agent.main import Agent, read_address_file
from supervisor.agent.sampler import RankSlots
from supervisor.client.layout import LAYOUT_VERSION, MAGIC, SLOT_SIZE
from supervisor.errors import SupervisorError
from supervisor.heartbeat import wire
from supervisor.heartbeat.live import live_document
from supervisor.heartbeat.table import LiveTable

KEY = wire.derive_key(b"f" * 32, b"channel")
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _mac(msg: bytes) -> bytes:
    return msg + hmac.digest(KEY, msg, hashlib.sha256)


def _header(kind: int, count: int, job: bytes, node: bytes, *, instance: int = 1, seq: int = 1,
            wall_ns: int | None = None, job_len: int | None = None, node_len: int | None = None) -> bytes:
    wall = time.time_ns() if wall_ns is None else wall_ns
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, kind, count, instance, seq, wall, 0,
                            len(job) if job_len is None else job_len, len(node) if node_len is None else node_len)


authenticated = st.builds(
    lambda kind, count, job, node, body, jl, nl: _mac(_header(kind, count, job, node, job_len=jl, node_len=nl)
                                                      + job + node + body),
    st.sampled_from([0, 1, 2, 3, 4, 255]), st.integers(0, 0xFFFF), st.sampled_from([b"9", b"", b"\xff\xfe"]),
    st.binary(max_size=12), st.binary(max_size=600), st.one_of(st.none(), st.integers(0, 255)),
    st.one_of(st.none(), st.integers(0, 255)),
)


def _counts_only_refusals(table: LiveTable, before: int) -> None:
    assert sum(table.counters.values()) == before + 1


@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), authenticated))
def test_frames_raise_only_frame_errors_and_the_table_never_raises(data: bytes) -> None:
    try:
        wire.decode(KEY, data, "9")
    except wire.FrameError as err:
        assert err.reason
    table = LiveTable(KEY, "9")
    table.feed(data, ("127.0.0.1", 1))
    _counts_only_refusals(table, 0)
    json.dumps(live_document(table.snapshot()), allow_nan=False)


@FUZZ
@given(ranks=st.lists(st.binary(min_size=wire.RANK.size, max_size=wire.RANK.size), min_size=1, max_size=8),
       later=st.lists(st.binary(min_size=wire.RANK.size, max_size=wire.RANK.size), min_size=1, max_size=8))
def test_any_authenticated_rank_bytes_make_a_valid_snapshot_and_live_json(ranks: list[bytes],
                                                                         later: list[bytes]) -> None:
    """A compromised or buggy agent can put any bits in a rank entry: snapshots and live.json still work."""
    clock = [100.0]
    table = LiveTable(KEY, "9", rate_window_s=1.0, mono=lambda: clock[0], wall_ns=time.time_ns)
    for seq, body in ((1, ranks), (2, later)):
        msg = _header(wire.KIND_SUMMARY, len(body), b"9", b"n1", seq=seq) + b"9" + b"n1" + b"".join(body)
        assert table.feed(_mac(msg), ("127.0.0.1", 1))
        clock[0] += 2.0
    snap = table.snapshot()
    json.dumps(live_document(snap), allow_nan=False)
    for view in snap.ranks:
        assert view.beat_age_s is None or math.isfinite(view.beat_age_s)
        assert view.loss is None or view.loss_step >= 0


@FUZZ
@given(commands=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)),
                         max_size=6),
       junk=st.binary(max_size=40), valid_node=st.booleans())
def test_agent_obeys_or_counts_any_authenticated_control_message(tmp_path: Path, commands: list[tuple[int, int, int]],
                                                               junk: bytes, valid_node: bool) -> None:
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700, exist_ok=True)
    agent = Agent(job="9", node="n1", key=KEY, supervisor=("127.0.0.1", 9), slot_dir=slots, campaign=tmp_path,
                  keep_slot_dir=True)
    try:
        body = b"".join(struct.pack("<BxxxIQ", c, r, a) for c, r, a in commands)
        node = b"n1" if valid_node else b"n2"
        for msg in (_header(wire.KIND_CONTROL, len(commands), b"9", node) + b"9" + node + body,
                    _header(wire.KIND_CONTROL, len(commands), b"9", node) + b"9" + node + body + junk):
            agent.handle(_mac(msg))
        # each datagram is obeyed or refused exactly once (a stack request may also *send* an event back)
        received = {k: v for k, v in agent.counters.items() if k not in ("sent", "send_errors", "refused")}
        assert sum(received.values()) == 2
    finally:
        agent.close()


@FUZZ
@given(payload=st.binary(min_size=SLOT_SIZE - 16, max_size=SLOT_SIZE - 16), good_header=st.booleans(),
       short=st.integers(0, SLOT_SIZE))
def test_any_slot_contents_give_a_record_or_nothing_and_always_pack(tmp_path: Path, payload: bytes,
                                                                   good_header: bool, short: int) -> None:
    """Whoever can write a slot (the rank, a bug, memory corruption) cannot crash the agent's sampler."""
    d = tmp_path / "slots"
    d.mkdir(mode=0o700, exist_ok=True)
    header = struct.pack("<8sII", MAGIC, LAYOUT_VERSION, SLOT_SIZE) if good_header else payload[:16]
    (d / "rank-0.slot").write_bytes(header + payload)
    (d / "rank-1.slot").write_bytes((header + payload)[:short])
    slots = RankSlots(d)
    try:
        slots.scan()
        entries = slots.sample()
        frame = wire.encode_summary(KEY, instance=1, seq=1, wall_ns=time.time_ns(), mono_ns=0, job="9", node="n1",
                                    ranks=entries)
        assert wire.decode(KEY, frame, "9").items == len(entries)
    finally:
        slots.close()


@FUZZ
@given(text=st.one_of(st.binary(max_size=300), st.just(b"[" * 70000), st.just(b'{"host": "h", "port": 1e400}'),
                     st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
    st.sampled_from(["host", "port", "channel", "pid"]),
    st.one_of(st.integers(), st.floats(), st.text(max_size=40), st.none(), st.booleans(),
              st.lists(st.integers(), max_size=2)), max_size=4))))
def test_the_address_file_parser_raises_only_supervisor_errors(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "aggregator.json"
    path.write_bytes(text)
    os.chmod(path, 0o600)
    try:
        (host, port), channel = read_address_file(tmp_path)
    except SupervisorError as err:
        assert "\n" not in err.one_line()
    else:
        assert isinstance(host, str) and isinstance(port, int) and isinstance(channel, bytes)


@pytest.mark.parametrize("reason", ["mac", "short", "too_long"])
def test_refusal_reasons_stay_short_counter_names(reason: str) -> None:
    data = {"mac": b"\0" * 100, "short": b"x", "too_long": b"\0" * (wire.MAX_FRAME + 1)}[reason]
    with pytest.raises(wire.FrameError) as err:
        wire.decode(KEY, data)
    assert err.value.reason == reason
