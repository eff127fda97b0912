"""The aggregator's live table, adapted for the detectors (uses the aggregator's real view types)."""

from __future__ import annotations

import math

from supervisor.decisions.detect import RANK_EXITED, RANK_STOPPED, Detector, snapshot_from_live
from supervisor.heartbeat import table as aggregator


def rank(node, r, **kw):
    base = dict(
        node=node, rank=r, pid=100 + r, step=10, phase="step", state="sleeping", beat_age_s=0.2, steps_per_s=1.0,
        ewma_steps_per_s=1.0, ewma_s=1.0, min_s=0.9, max_s=1.1, loss=0.5, loss_step=10, beats=10, cpu_s=1.0, cpu_frac=1.0,
        rank_flags=0, control_flags=0, exit_code=None, exit_signal=None,
    )  # fmt: skip
    base.update(kw)
    return aggregator.RankView(**base)


def live(ranks, staleness=None):
    names = sorted({r.node for r in ranks} | set(staleness or {}))
    nodes = {n: aggregator.NodeView(n, (staleness or {}).get(n, 0.1), 2, 5, 5, 0.0, "127.0.0.1") for n in names}
    return aggregator.Snapshot(taken_wall=0.0, job="1", nodes=nodes, ranks=ranks, counters={})


def test_adapter_maps_states_ages_and_exit_signals():
    snap = snapshot_from_live(
        live([rank("node1", 0), rank("node1", 1, state="stopped"), rank("node2", 2, state="exited", exit_signal=9)]),
        launch_age_s=3.0,
    )
    views = {v.rank: v for v in snap.ranks()}
    assert views[0].iter_ewma_s == 1.0 and views[0].iter_max_s == 1.1 and views[0].beat_age_s == 0.2
    assert views[2].exit_code == -9 and views[1].proc_state == "stopped"
    assert {n.node: n.summary_age_s for n in snap.nodes} == {"node1": 0.1, "node2": 0.1}
    det = Detector()
    found = det.observe(snap, 0.0) + det.observe(snap, 5.0) + det.observe(snap, 6.0)
    assert sorted(e.kind for e in found) == [RANK_EXITED, RANK_STOPPED]


def test_a_node_with_no_ranks_left_still_counts_and_loss_step_marks_missing_loss():
    node_only = snapshot_from_live(live([], staleness={"node3": 12.0}))
    assert [(n.node, n.summary_age_s, n.ranks) for n in node_only.nodes] == [("node3", 12.0, ())]
    (view,) = snapshot_from_live(live([rank("node1", 0, loss=math.nan, loss_step=-1, ewma_s=0.0)])).ranks()
    assert view.loss is None and view.iter_ewma_s is None
    (nan,) = snapshot_from_live(live([rank("node1", 0, loss=math.nan, loss_step=7)])).ranks()
    assert math.isnan(nan.loss)  # a real NaN loss stays visible to the NaN detector
