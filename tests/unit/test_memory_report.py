"""The memory-store inventory on the wire (heartbeat/memory_report.py) and in the supervisor's table: what an
agent sends reads back the same (digests cut to 128 bits), a big store is cut to one event with the newest steps
kept, and any text, however malformed, raises only the wire's own error."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.memory_pick import Held
from supervisor.heartbeat import wire
from supervisor.heartbeat.memory_report import (
    DIGEST_CHARS,
    MAX_OFF,
    encode_memory,
    parse_memory,
    parse_memory_report,
)
from supervisor.heartbeat.table import LiveTable

held = st.builds(Held, step=st.integers(0, 10**9), rank=st.integers(0, 7), world=st.just(8),
                 digest=st.text("0123456789abcdef", min_size=64, max_size=64), verified=st.booleans(),
                 launch=st.text(max_size=20))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(held, max_size=40))
def test_an_inventory_reads_back_as_sent(items: list[Held]) -> None:
    text = encode_memory(items)
    assert len(text.encode()) <= wire.MAX_TEXT
    back = parse_memory(text)
    doc = json.loads(text)
    assert len(back) + doc["more"] == len(items)
    want = sorted(((h.step, h.rank, h.world, h.digest[:DIGEST_CHARS], h.verified, h.launch) for h in items),
                  key=lambda t: (-t[0], t[1]))[: len(back)]  # fmt: skip
    assert [(h.step, h.rank, h.world, h.digest, h.verified, h.launch) for h in back] == want


@settings(max_examples=100, deadline=None)
@given(st.lists(held, max_size=10), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 4095)), max_size=80))
def test_the_ranks_whose_store_failed_them_read_back_with_the_shards(items: list[Held],
                                                                      off: list[tuple[int, int]]) -> None:
    report = parse_memory_report(encode_memory(items, "10.0.0.1:5000", off))
    assert report.off == tuple(sorted(off)[:MAX_OFF]) and report.listen == "10.0.0.1:5000"
    assert len(report.held) == len(items)


def test_a_big_store_keeps_its_newest_steps() -> None:
    items = [Held(step, r, 8, "a" * 64, True, "j-0-1") for step in range(100) for r in range(8)]
    back = parse_memory(encode_memory(items))
    assert 8 < len(back) < len(items) and min(h.step for h in back) > 80


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.recursive(
    st.one_of(st.integers(-5, 2**63), st.text(max_size=40), st.booleans(), st.none(), st.floats()),
    lambda inner: st.one_of(st.lists(inner, max_size=7), st.dictionaries(st.sampled_from(["held", "more", "off", "listen", "x"]), inner)),
    max_leaves=30).map(json.dumps)))  # fmt: skip
def test_any_text_is_parsed_or_refused_with_the_wires_error(text: str) -> None:
    try:
        parse_memory(text)
    except wire.FrameError as err:
        assert err.reason == "memory"


def test_the_table_keeps_each_nodes_newest_inventory_and_counts_bad_ones() -> None:
    key = wire.derive_key(b"s" * 32, b"c")
    table = LiveTable(key, "7", wall_ns=lambda: 1_000 * 10**9)

    def frame(seq: int, text: str) -> bytes:
        return wire.encode_events(key, instance=1, seq=seq, wall_ns=1_000 * 10**9, mono_ns=seq, job="7", node="n1",
                                  events=[wire.Event(wire.EVENT_MEMORY, 0, text)])  # fmt: skip

    assert table.feed(frame(1, encode_memory([Held(4, 0, 1, "b" * 64, True, "j-0-1")])))
    assert table.memory["n1"][1] == (Held(4, 0, 1, "b" * DIGEST_CHARS, True, "j-0-1"),)
    assert table.feed(frame(2, '{"held": [[1, 2]], "more": 0}'))  # authenticated, but not an inventory
    assert table.memory_refused == 1 and table.memory["n1"][1][0].step == 4
