"""Wire frames: round trips, and every kind of bad frame refused with a reason (never an exception)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.heartbeat import wire
from supervisor.heartbeat.table import LiveTable

KEY = wire.derive_key(b"k" * 32)
OTHER_KEY = wire.derive_key(b"x" * 32)
S = 10**9
NOW = 1_700_000_000 * 10**9


def entry(rank: int, **kw: object) -> wire.RankEntry:
    base = dict(rank=rank, pid=1000 + rank, step=42, phase=1, state=wire.ST_RUNNING, rank_flags=0,
                control_flags=0, beat_age_ms=120, ewma_s=0.5, min_s=0.25, max_s=1.0, loss=2.5, loss_step=42, beats=43,
                exit_code=wire.EXIT_UNKNOWN, exit_signal=0, cpu_s=12.25)
    base.update(kw)
    return wire.RankEntry(**base)  # type: ignore[arg-type]


def summary(seq: int = 1, *, key: bytes = KEY, job: str = "123", node: str = "node1", instance: int = 7,
            wall_ns: int = NOW, ranks: list[wire.RankEntry] | None = None) -> bytes:
    return wire.encode_summary(key, instance=instance, seq=seq, wall_ns=wall_ns, mono_ns=5 * 10**9, job=job,
                               node=node, ranks=ranks if ranks is not None else [entry(0), entry(1)])


def test_summary_round_trip_preserves_every_field_including_nan_loss() -> None:
    ranks = [entry(0), entry(1, loss=float("nan"), state=wire.ST_STOPPED), entry(2, loss=float("-inf"))]
    frame = wire.decode(KEY, summary(ranks=ranks), job="123")
    assert (frame.kind, frame.items, frame.node, frame.job, frame.seq) == (wire.KIND_SUMMARY, 3, "node1", "123", 1)
    out = list(wire.iter_ranks(frame.body))
    assert out[0] == ranks[0]
    assert math.isnan(out[1].loss) and out[1].state == wire.ST_STOPPED
    assert out[2].loss == float("-inf")


def test_a_node_of_eight_ranks_fits_in_a_small_datagram() -> None:
    assert wire.RANK.size == 96
    assert len(summary(ranks=[entry(r) for r in range(8)])) < 900  # one Ethernet frame (MTU 1500)


def _as_version(frame: bytes, version: int) -> bytes:
    """``frame`` (today's) as an agent of an earlier release sent it: that version in the header, each entry cut to
    that version's size, sealed again."""
    import hashlib
    import hmac

    new = frame[:-wire.MAC_LEN]
    head = bytearray(new[:wire.HEADER.size + 3 + 5])
    head[4] = version
    body = new[len(head):]
    size = wire.RANK_SIZES[version]
    msg = bytes(head) + b"".join(body[i:i + size] for i in range(0, len(body), wire.RANK.size))
    return msg + hmac.digest(KEY, msg, hashlib.sha256)


def test_own_time_and_restore_time_travel_and_older_agents_are_still_understood_without_them() -> None:
    ranks = [entry(0, own_s=0.25, restore_ms=1234, restores=2), entry(1, own_s=0.0)]
    out = list(wire.iter_ranks(wire.decode(KEY, summary(ranks=ranks), job="123").body))
    assert [e.own_s for e in out] == [0.25, 0.0]
    assert [(e.restore_ms, e.restores) for e in out] == [(1234, 2), (0, 0)]
    # Version 3's frame: 88-byte entries (everything up to own time): restore time reads 0.
    v3 = list(wire.iter_ranks(wire.decode(KEY, _as_version(summary(ranks=ranks), 3), job="123").body))
    assert [e._replace(restore_ms=0, restores=0) for e in out] == v3
    # Version 2's frame: 84-byte entries (everything up to ckpt_step).
    old = list(wire.iter_ranks(wire.decode(KEY, _as_version(summary(ranks=ranks), 2), job="123").body))
    assert [e._replace(own_s=0.0, restore_ms=0, restores=0) for e in out] == old and all(e.own_s == 0.0 for e in old)
    # The live table: an own time of 0 means "not measured" (None), a positive one is kept; restore time as sent.
    table = LiveTable(KEY, "123", wall_ns=lambda: NOW)
    assert table.feed(summary(ranks=ranks))
    assert [(r.own_s, r.restore_ms, r.restores) for r in table.rank_views()] == [(0.25, 1234, 2), (None, 0, 0)]
    with pytest.raises(wire.FrameError, match="length"):  # a version-2 header with today's entries is refused
        import hashlib
        import hmac

        new = summary(ranks=ranks)[:-wire.MAC_LEN]
        head = bytearray(new[:wire.HEADER.size + 3 + 5])
        head[4] = 2
        body_msg = bytes(head) + new[len(head):]
        wire.decode(KEY, body_msg + hmac.digest(KEY, body_msg, hashlib.sha256))


def test_out_of_range_values_are_clamped_not_fatal() -> None:
    frame = wire.decode(KEY, summary(ranks=[entry(0, beat_age_ms=2**40, step=2**70, exit_code=99999,
                                                   ewma_s=1e300)]))
    (e,) = wire.iter_ranks(frame.body)
    assert e.beat_age_ms == 0xFFFFFFFE and e.step == 2**63 - 1 and e.exit_code == 32767 and e.ewma_s < 1e39


def test_too_many_ranks_is_a_clear_error_at_the_sender() -> None:
    with pytest.raises(ValueError, match="exceed the frame limit"):
        summary(ranks=[entry(r) for r in range(wire.MAX_RANKS + 1)])


def test_control_and_event_round_trip() -> None:
    cmds = [wire.Command(wire.CMD_SET_FLAGS, 3, 2), wire.Command(wire.CMD_DUMP_STACKS), wire.Command(wire.CMD_EXIT)]
    raw = wire.encode_control(KEY, instance=1, seq=9, wall_ns=NOW, mono_ns=1, job="123", node="node2", commands=cmds)
    assert wire.commands(wire.decode(KEY, raw, "123")) == cmds
    evs = [wire.Event(wire.EVENT_STACKS_SAVED, 4, "/c/stacks/node2-rank4-1.txt"), wire.Event(2, 5, "é no pid")]
    raw = wire.encode_events(KEY, instance=1, seq=10, wall_ns=NOW, mono_ns=1, job="123", node="node2", events=evs)
    assert wire.events(wire.decode(KEY, raw, "123")) == evs


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "short"),
    (b"SVW1" + b"\0" * 10, "short"),
    (b"\0" * (wire.MAX_FRAME + 1), "too_long"),
])
def test_garbage_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(wire.FrameError) as err:
        wire.decode(KEY, data)
    assert err.value.reason == reason


def test_wrong_key_and_wrong_job_are_refused() -> None:
    with pytest.raises(wire.FrameError, match="mac"):
        wire.decode(KEY, summary(key=OTHER_KEY))
    with pytest.raises(wire.FrameError, match="job"):
        wire.decode(KEY, summary(job="999"), job="123")


def test_authenticated_but_inconsistent_lengths_are_refused() -> None:
    # A sender holding the key but writing a body that does not match its item count.
    frame = wire.decode(KEY, summary())
    head = wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.KIND_SUMMARY, 5, 1, 1, NOW, 0, 3, 5)
    msg = head + b"123node1" + frame.body
    import hashlib
    import hmac

    with pytest.raises(wire.FrameError, match="length"):
        wire.decode(KEY, msg + hmac.digest(KEY, msg, hashlib.sha256))
    head = wire.HEADER.pack(wire.MAGIC, wire.VERSION, 99, 0, 1, 1, NOW, 0, 3, 5)
    msg = head + b"123node1"
    with pytest.raises(wire.FrameError, match="kind"):
        wire.decode(KEY, msg + hmac.digest(KEY, msg, hashlib.sha256))


def test_every_single_bit_flip_of_a_valid_frame_is_refused() -> None:
    good = summary()
    for i in range(len(good) * 8):
        bad = bytearray(good)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(wire.FrameError):
            wire.decode(KEY, bytes(bad), job="123")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_crash_the_table_and_are_counted(data: bytes) -> None:
    table = LiveTable(KEY, "123", wall_ns=lambda: NOW)
    assert table.feed(data, ("127.0.0.1", 1)) is False
    assert sum(v for k, v in table.counters.items() if k.startswith("rejected_")) == 1
    assert table.nodes == {}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.binary(min_size=1, max_size=8))
def test_spliced_valid_frames_are_refused(cut: int, junk: bytes) -> None:
    good = summary()
    cut %= len(good)
    for bad in (good[:cut], good[:cut] + junk + good[cut:], good + junk):
        with pytest.raises(wire.FrameError):
            wire.decode(KEY, bad, job="123")


def test_replay_guard_refuses_repeats_old_seqs_and_retired_instances() -> None:
    g = wire.ReplayGuard(window_s=60)
    assert g.check("n1", 1, 1, NOW, NOW) is None
    assert g.check("n1", 1, 1, NOW, NOW) == "replay"
    assert g.check("n1", 1, 5, NOW, NOW) is None
    assert g.lost == 3
    assert g.check("n1", 1, 4, NOW, NOW) == "replay"  # reordered older frame
    assert g.check("n1", 2, 1, NOW - 61 * 10**9, NOW) == "stale"  # a recorded frame of some other run
    assert g.check("n1", 2, 1, NOW, NOW) == "replay"  # not sent after the current instance's last frame
    assert g.check("n1", 2, 1, NOW + S, NOW + S) is None  # agent restarted
    assert g.check("n1", 1, 6, NOW + 2 * S, NOW + 2 * S) == "replay"  # the old instance is retired for good
    assert g.check("n2", 1, 1, NOW + 61 * 10**9, NOW) == "stale"  # from the future
    assert g.check("n1", 2, 2, NOW - 61 * 10**9, NOW + 2 * S) == "stale"  # the window applies to every frame


def test_recorded_frames_of_an_earlier_agent_cannot_lock_out_the_live_one() -> None:
    """Issue 10 finding 1 (within one run): a recorded frame of an earlier agent instance, replayed inside the
    freshness window, must not retire the live instance (its frames would then be refused as replays)."""
    g = wire.ReplayGuard(window_s=60)
    assert g.check("n1", 7, 1, NOW, NOW) is None  # an earlier agent; an attacker records this frame
    assert g.check("n1", 8, 1, NOW + S, NOW + S) is None  # the agent restarts: the live instance
    assert g.check("n1", 8, 2, NOW + 2 * S, NOW + 2 * S) is None
    assert g.check("n1", 9, 1, NOW + S // 2, NOW + 3 * S) == "replay"  # recorded before the live one's last frame
    assert g.check("n1", 7, 2, NOW + 3 * S, NOW + 3 * S) == "replay"  # retired
    assert g.check("n1", 8, 3, NOW + 3 * S, NOW + 3 * S) is None  # the live agent is still heard


def test_table_counts_replays_and_wrong_keys_without_storing_them() -> None:
    table = LiveTable(KEY, "123", wall_ns=lambda: NOW)
    assert table.feed(summary(1)) and table.feed(summary(2))
    assert not table.feed(summary(2))
    assert not table.feed(summary(3, key=OTHER_KEY))
    assert not table.feed(summary(4, job="124"))
    ctl = wire.encode_control(KEY, instance=1, seq=1, wall_ns=NOW, mono_ns=0, job="123", node="node1", commands=[])
    assert not table.feed(ctl)  # agents must not send control frames
    assert table.counters == {"ok": 2, "rejected_replay": 1, "rejected_mac": 1, "rejected_job": 1,
                              "rejected_kind": 1}
    assert table.nodes["node1"].seq == 2


u32, u8 = st.integers(0, 2**32 - 1), st.integers(0, 255)
f32 = st.floats(width=32, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.builds(wire.RankEntry, rank=u32, pid=u32, step=st.integers(-(2**63), 2**63 - 1), phase=u8, state=u8,
                 rank_flags=u8, control_flags=u8, beat_age_ms=u32, ewma_s=f32, min_s=f32, max_s=f32,
                 loss=st.floats(), loss_step=st.integers(-(2**63), 2**63 - 1), beats=st.integers(0, 2**64 - 1),
                 exit_code=st.integers(-32768, 32767), exit_signal=u8, cpu_s=st.floats(), ckpt_ms=u32,
                 ckpt_step=st.integers(-(2**63), 2**63 - 1), own_s=f32,
                 restore_ms=u32, restores=u32))
def test_any_in_range_rank_entry_round_trips_exactly(e: wire.RankEntry) -> None:
    (out,) = wire.iter_ranks(wire.decode(KEY, summary(ranks=[e])).body)
    for name, a, b in zip(wire.RankEntry._fields, out, e, strict=True):
        assert a == b or (a != a and b != b), name  # NaN == NaN here


def test_rank_flags_above_the_first_byte_travel_in_the_byte_that_was_padding() -> None:
    """RANK_FLAG_PEER_FAILED is bit 8: it rides in the entry's former pad byte, which older agents leave 0."""
    from supervisor.client.layout import RANK_FLAG_AWAITING_RESTART, RANK_FLAG_PEER_FAILED

    flags = RANK_FLAG_AWAITING_RESTART | RANK_FLAG_PEER_FAILED
    ranks = [entry(0)._replace(rank_flags=flags), entry(1)]
    out = list(wire.iter_ranks(wire.decode(KEY, summary(ranks=ranks), job="123").body))
    assert [e.rank_flags for e in out] == [flags, ranks[1].rank_flags]
    table = LiveTable(KEY, "123", wall_ns=lambda: NOW)
    assert table.feed(summary(ranks=ranks))
    assert [r.rank_flags for r in table.rank_views()] == [flags, ranks[1].rank_flags]
