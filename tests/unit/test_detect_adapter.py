"""From wire frames to what the detectors read: the live table's own rank views, grouped by node.

One rank view type from the table to the detectors: these tests feed real frames into a real ``LiveTable``
and check that the detectors see the same facts under the same names (no adapter renames anything).
"""

from __future__ import annotations

import math

from supervisor import procstate
from supervisor.decisions.detect import RANK_EXITED, RANK_STOPPED, Detector, RankView, snapshot_from_live
from supervisor.heartbeat import table, wire

KEY = wire.derive_key(b"k" * 32)
WALL = 1_700_000_000 * 10**9


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> int:
        return WALL + int(self.t * 1e9)


def entry(rank: int, *, state: str = procstate.SLEEPING, loss: float = 0.5, loss_step: int = 10,
          ewma: float = 1.0, code: int = wire.EXIT_UNKNOWN, signal: int = 0) -> wire.RankEntry:
    return wire.RankEntry(rank, 100 + rank, 10, 1, procstate.CODES[state], 0, 0, 200, ewma, 0.9, 1.1, loss,
                          loss_step, 10, code, signal, 1.0)


def live(frames: dict[str, list[wire.RankEntry]], *, silent: tuple[str, ...] = ()) -> table.Snapshot:
    clock = Clock()
    t = table.LiveTable(KEY, "1", mono=clock.mono, wall_ns=clock.wall)
    for seq, (node, ranks) in enumerate(sorted(frames.items()), 1):
        assert t.feed(wire.encode_summary(KEY, instance=seq, seq=1, wall_ns=clock.wall(), mono_ns=0, job="1",
                                          node=node, ranks=ranks))
    clock.t += 0.1
    for seq, node in enumerate(silent, 100):
        assert t.feed(wire.encode_summary(KEY, instance=seq, seq=1, wall_ns=clock.wall(), mono_ns=0, job="1",
                                          node=node, ranks=[]))
    clock.t += 12.0 if silent else 0.0
    return t.snapshot()


def test_the_detectors_read_the_tables_own_views() -> None:
    snap = snapshot_from_live(live({"node1": [entry(0), entry(1, state=procstate.STOPPED)],
                                    "node2": [entry(2, state=procstate.GONE, signal=9)]}), launch_age_s=3.0)
    views = {v.rank: v for v in snap.ranks()}
    assert all(type(v) is RankView for v in views.values())
    assert views[0].ewma_s == 1.0 and math.isclose(views[0].max_s or 0, 1.1, rel_tol=1e-6)
    assert math.isclose(views[0].beat_age_s or 0, 0.3)  # the agent's 0.2 s + 0.1 s since receipt
    assert views[2].exit_status == -9 and views[2].exit_code is None and views[1].state == procstate.STOPPED
    assert {n.node: round(n.staleness_s, 3) for n in snap.nodes} == {"node1": 0.1, "node2": 0.1}
    det = Detector()
    found = det.observe(snap, 0.0) + det.observe(snap, 5.0) + det.observe(snap, 6.0)
    assert sorted(e.kind for e in found) == [RANK_EXITED, RANK_STOPPED]


def test_a_node_with_no_ranks_left_still_counts_and_loss_step_marks_missing_loss() -> None:
    node_only = snapshot_from_live(live({}, silent=("node3",)))
    assert [(n.node, round(n.staleness_s, 3), n.ranks) for n in node_only.nodes] == [("node3", 12.0, ())]
    (view,) = snapshot_from_live(live({"node1": [entry(0, loss=math.nan, loss_step=-1, ewma=0.0)]})).ranks()
    assert view.loss is None and view.ewma_s is None
    (nan,) = snapshot_from_live(live({"node1": [entry(0, loss=math.nan, loss_step=7)]})).ranks()
    assert nan.loss is not None and math.isnan(nan.loss)  # a real NaN loss stays visible to the NaN detector


def test_process_states_have_one_meaning_everywhere() -> None:
    assert [procstate.name(c) for c in range(len(procstate.NAMES))] == list(wire.STATES)
    assert procstate.name(200) == "state200"
    assert {s: procstate.meaning(s) for s in procstate.NAMES} == {
        "unknown": "alive", "running": "alive", "sleeping": "alive", "disk_wait": "alive", "stopped": "stopped",
        "zombie": "gone", "gone": "gone", "exited": "gone", "no_pid": "alive"}  # fmt: skip
    assert procstate.meaning(None) == "alive" and procstate.meaning("state200") == "alive"
