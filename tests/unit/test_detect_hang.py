"""Hang detection over simulated live tables: rank, node and global stalls; learned timeouts in use."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.detect import (
    GLOBAL_STALL,
    NODE_SILENT,
    RANK_EXITED,
    RANK_HANG,
    RANK_STOPPED,
    DetectConfig,
    Detector,
    HangConfig,
    LaunchView,
    NodeRanks,
    RankView,
    TimeoutConfig,
)

NODES = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


class Cluster:
    """Ranks that beat once per step; a test freezes some of them. Times in seconds."""

    def __init__(self, step_s=1.0, ranks=4):
        self.step_s = step_s
        self.last_beat = {r: 0.0 for r in range(ranks)}
        self.step = {r: 0 for r in range(ranks)}
        self.frozen: set[int] = set()
        self.state = {r: "sleeping" for r in range(ranks)}
        self.node_age = {"node1": 0.0, "node2": 0.0}
        self.flags: dict[int, int] = {}

    def advance(self, now, durations=None):
        for r in self.last_beat:
            if r in self.frozen:
                continue
            d = durations(r) if durations else self.step_s
            while now - self.last_beat[r] >= d:
                self.last_beat[r] += d
                self.step[r] += 1
                d = durations(r) if durations else self.step_s

    def snapshot(self, now):
        views = [
            RankView(
                rank=r,
                node=NODES[r],
                pid=1000 + r,
                step=self.step[r],
                phase="step",
                beat_age_s=now - self.last_beat[r],
                state=self.state[r],
                rank_flags=self.flags.get(r, 0),
            )
            for r in self.last_beat
        ]
        nodes = tuple(
            NodeRanks(n, self.node_age[n], tuple(v for v in views if v.node == n)) for n in ("node1", "node2")
        )
        return LaunchView(nodes=nodes, launch_age_s=now)


def run(detector, cluster, start, end, dt=0.25, durations=None):
    found = []
    t = start
    while t < end:
        cluster.advance(t, durations)
        found += [(t, e) for e in detector.observe(cluster.snapshot(t), t)]
        t += dt
    return found


def fast_config(**kw):
    return DetectConfig(timeouts=TimeoutConfig(step_floor_s=2.0, warmup_samples=20, warmup_timeout_s=60, **kw))


def test_a_silent_rank_is_flagged_once_within_the_learned_timeout():
    det, cl = Detector(fast_config()), Cluster(step_s=1.0)
    assert run(det, cl, 0, 30) == []
    learned = det.timeouts.timeout("step")
    assert learned == pytest.approx(3.0)  # k x p99 of 1 s steps, measured between beats (no sampling jitter)
    cl.frozen.add(3)
    cl.last_beat[3] = 30.0
    found = run(det, cl, 30, 40)
    first = [(t, e) for t, e in found if e.kind == RANK_HANG]
    assert first, found
    t, event = first[0]
    assert event.ranks == (3,) and event.nodes == ("node2",)
    assert event.value is not None and event.threshold == learned and event.value > learned
    assert t - 30.0 <= learned + 0.25 + 1e-9
    assert len(first) == 1  # reported at onset only


def test_all_silent_on_the_same_step_is_a_global_stall_without_culprits():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))
    found = [e for _, e in run(det, cl, 30, 40)]
    assert [e.kind for e in found] == [GLOBAL_STALL]
    assert found[0].ranks == (0, 1, 2, 3)


def test_when_everyone_stalls_the_rank_behind_is_named():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))
    cl.step[1] -= 1
    found = [e for _, e in run(det, cl, 30, 40)]
    assert [e.kind for e in found] == [RANK_HANG] and found[0].ranks == (1,)


def test_a_stopped_process_is_a_hang_after_a_short_grace():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.add(2)
    cl.state[2] = "stopped"
    found = run(det, cl, 30, 33)
    kinds = [(t, e.kind, e.ranks) for t, e in found]
    assert kinds and kinds[0][1:] == (RANK_STOPPED, (2,)) and kinds[0][0] <= 32.25
    cl.state[2], cl.frozen = "sleeping", set()  # SIGCONT: it resumes
    cl.last_beat[2] = 33.0
    assert run(det, cl, 33, 36) == []
    cl.state[2] = "stopped"
    assert [e.kind for _, e in run(det, cl, 36, 39)][:1] == [RANK_STOPPED]  # re-armed after it cleared


def test_exited_and_zombie_ranks_are_reported_with_their_exit_code():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 5)
    snap = cl.snapshot(5.0)
    views = list(snap.ranks())
    views[0] = RankView(0, "node1", 1000, 5, "step", 0.1, state="exited", exit_signal=9)
    views[1] = RankView(1, "node1", 1001, 5, "step", 0.1, state="zombie")
    snap = LaunchView((NodeRanks("node1", 0.0, tuple(views[:2])), NodeRanks("node2", 0.0, tuple(views[2:]))))
    found = det.observe(snap, 5.0)
    assert sorted((e.kind, e.ranks) for e in found) == [(RANK_EXITED, (0,)), (RANK_EXITED, (1,))]
    assert any("code -9" in line for e in found for line in e.evidence)


def test_a_silent_node_is_reported_as_such_and_not_as_hung_ranks():
    det, cl = Detector(replace(fast_config(), hang=HangConfig(node_stale_s=1.0, node_silence_s=10.0))), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update({2, 3})
    found = []
    t = 30.0
    while t < 45:
        cl.advance(t)
        cl.node_age["node2"] = t - 30.0
        found += det.observe(cl.snapshot(t), t)
        t += 0.25
    assert [e.kind for e in found] == [NODE_SILENT]
    assert found[0].nodes == ("node2",) and found[0].ranks == (2, 3)


def test_ranks_without_the_client_are_never_called_hung():
    det = Detector(fast_config())
    views = tuple(RankView(r, "node1", 10 + r, state="sleeping") for r in range(2))
    for t in range(0, 5000, 100):
        assert det.observe(LaunchView((NodeRanks("node1", 0.0, views),)), float(t)) == []


def test_first_step_gets_the_init_allowance():
    det = Detector(fast_config(init_allowance_s=100))
    for t in range(0, 99):
        view = RankView(0, "node1", 1, step=0, phase="step", beat_age_s=float(t))
        other = RankView(1, "node1", 2, step=0, phase="step", beat_age_s=float(t))
        assert det.observe(LaunchView((NodeRanks("node1", 0.0, (view, other)),)), float(t)) == []


def test_relaunch_keeps_learned_timeouts_and_state_is_copyable():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    learned = det.timeouts.timeout("step")
    twin = copy.deepcopy(det)
    cl2 = copy.deepcopy(cl)
    cl.frozen.add(0)
    cl2.frozen.add(0)
    assert [e for _, e in run(det, cl, 30, 40)] == [e for _, e in run(twin, cl2, 30, 40)]
    det.new_launch()
    assert det.timeouts.timeout("step") == learned and det.hang.state.tracks == {}


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    low=st.floats(min_value=0.2, max_value=2.0),
    spread=st.floats(min_value=1.0, max_value=2.9),
)
def test_ranks_beating_within_k_times_their_step_time_are_never_flagged(seed, low, spread):
    """Step times in [low, spread*low] with spread < k: k x p99 >= k x low > the longest step."""
    import random

    rng = random.Random(seed)
    det = Detector(DetectConfig(timeouts=TimeoutConfig(step_floor_s=0.1, warmup_samples=10, warmup_timeout_s=60)))
    cl = Cluster(step_s=low)
    found = run(det, cl, 0, 40 * low * spread, dt=low / 3, durations=lambda r: rng.uniform(low, spread * low))
    assert found == []


def test_a_slow_first_step_and_rare_outliers_do_not_inflate_the_timeout():
    det, cl = Detector(fast_config()), Cluster()
    slow = {1: 30.0, 150: 2.5}  # compile on the first step; one slow step later (under the timeout)

    def durations(r):
        return slow.get(cl.step[r] + 1, 1.0)

    assert [e.kind for _, e in run(det, cl, 0, 300, durations=durations)] == []
    assert 3.0 <= det.timeouts.timeout("step") <= 3.0 * 1.08  # p99 is still the 1 s steps (one bucket up)


def test_ranks_waiting_for_a_peers_checkpoint_are_not_hung_but_a_stuck_checkpoint_is():
    det = Detector(DetectConfig(timeouts=TimeoutConfig(step_floor_s=2.0, warmup_samples=20, checkpoint_allowance_s=60)))
    cl = Cluster()
    run(det, cl, 0, 30)

    def table(t, saver_phase="checkpoint"):
        views = [RankView(0, "node1", 1000, 30, saver_phase, t - 30.0, state="sleeping")]
        views += [RankView(r, NODES[r], 1000 + r, 30, "step", t - 30.0, state="sleeping") for r in (1, 2, 3)]
        return LaunchView(tuple(NodeRanks(n, 0.0, tuple(v for v in views if v.node == n)) for n in ("node1", "node2")))

    assert [e for t in range(30, 90) for e in det.observe(table(float(t)), float(t))] == []
    late = det.observe(table(91.0), 91.0)
    assert [e.kind for e in late] == [GLOBAL_STALL]  # the checkpoint itself overran its allowance


def _collective_checkpoint(t, hung_rank=None, hung_since=None, step=30, start=30.0):
    """Every rank finished ``step`` at ``start`` and entered a collective checkpoint, except ``hung_rank``: it
    stopped beating at ``hung_since`` one step behind, so the others wait for it inside the checkpoint."""
    views = []
    for r, node in NODES.items():
        if r == hung_rank:
            views.append(RankView(r, node, 1000 + r, step - 1, "step", t - hung_since, state="sleeping"))
        else:
            views.append(RankView(r, node, 1000 + r, step, "checkpoint", t - start, state="sleeping"))
    return LaunchView(tuple(NodeRanks(n, 0.0, tuple(v for v in views if v.node == n)) for n in ("node1", "node2")))


def test_a_hang_right_before_a_collective_checkpoint_is_judged_by_the_step_timeout():
    det = Detector(DetectConfig(timeouts=TimeoutConfig(step_floor_s=2.0, warmup_samples=20, checkpoint_allowance_s=600)))
    run(det, Cluster(), 0, 29.5)
    step_timeout = det.timeouts.timeout("step")
    found = []
    t = 29.5
    while not found and t < 600:
        t += 0.25
        found = det.observe(_collective_checkpoint(t, hung_rank=3, hung_since=29.0), t)
    assert [(e.kind, e.ranks, e.nodes) for e in found] == [(RANK_HANG, (3,), ("node2",))]
    assert t - 29.0 <= step_timeout + 0.25 + 1e-9, "judged by the checkpoint allowance, not its own step timeout"
    assert found[0].threshold == step_timeout and "step phase" in found[0].evidence[0]
    # the peers waiting for it inside the checkpoint are neither hung nor named, for the whole allowance
    for later in range(int(t) + 1, 600, 7):
        assert det.observe(_collective_checkpoint(float(later), 3, 29.0), float(later)) == []


def test_the_rank_everyone_waits_for_is_never_given_their_allowance():
    """Whatever the busy peers' phase and allowance, a rank one step behind them is judged by its own timeout."""
    for phase_allowance in (60.0, 900.0, 5000.0):
        det = Detector(DetectConfig(timeouts=TimeoutConfig(step_floor_s=2.0, warmup_samples=20,
                                                           checkpoint_allowance_s=phase_allowance)))  # fmt: skip
        run(det, Cluster(), 0, 29.5)
        late = 29.0 + det.timeouts.timeout("step") + 0.5
        assert [e.ranks for e in det.observe(_collective_checkpoint(late, 3, 29.0), late)] == [(3,)]


@settings(max_examples=300)
@given(
    ranks=st.lists(
        st.tuples(st.sampled_from(["step", "checkpoint", "eval", None]), st.one_of(st.none(), st.integers(0, 4)),
                  st.floats(0, 100), st.sampled_from([5.0, 60.0, 900.0])),
        min_size=1, max_size=12,
    )
)  # fmt: skip
def test_a_rank_never_borrows_the_allowance_of_a_busy_peer_ahead_of_it(ranks):
    """Against the rule spelled out: the allowance a step-phase rank gets is the largest of its own and those of
    busy peers (non-step phase, within their allowance) that are not on a newer step."""
    from supervisor.decisions.detect.hang import RankTrack, _WaitAllowance

    beating = [(RankView(i, "n", i, step, phase, age), RankTrack(step, 0.0, 0, phase, 0.0))
               for i, (phase, step, age, _) in enumerate(ranks)]  # fmt: skip
    limits = [lim for *_, lim in ranks]
    allowance = _WaitAllowance(beating, limits)
    for (view, _), own in zip(beating, limits, strict=True):
        expected = own
        if view.phase == "step":
            for (peer, _), peer_limit in zip(beating, limits, strict=True):
                busy = peer.phase != "step" and peer.beat_age_s is not None and peer.beat_age_s <= peer_limit
                ahead = view.step is not None and peer.step is not None and peer.step > view.step
                if busy and not ahead:
                    expected = max(expected, peer_limit)
        assert allowance.limit(view, own) == expected


def test_every_agent_quiet_together_is_reported_at_once_not_the_first_node_alone():
    """Summaries are staggered: node1's last one is older by a fraction of the interval. When every agent went
    quiet together, both nodes are silent in the same detection pass, so the classifier sees "everyone silent"."""
    det, cl = Detector(replace(fast_config(), hang=HangConfig(node_stale_s=3.0, node_silence_s=10.0))), Cluster()
    run(det, cl, 0, 30)
    found = []
    t = 30.0
    while t < 45 and not found:
        cl.advance(t)
        cl.node_age["node1"] = t - 30.0 + 0.8
        cl.node_age["node2"] = t - 30.0
        found += det.observe(cl.snapshot(t), t)
        t += 0.25
    assert sorted(n for e in found if e.kind == NODE_SILENT for n in e.nodes) == ["node1", "node2"]


def test_one_quiet_node_while_the_others_report_is_that_node_alone():
    det, cl = Detector(replace(fast_config(), hang=HangConfig(node_stale_s=3.0, node_silence_s=10.0))), Cluster()
    run(det, cl, 0, 30)
    found = []
    t = 30.0
    while t < 45 and not found:
        cl.advance(t)
        cl.node_age["node1"] = t - 30.0
        cl.node_age["node2"] = 0.5
        found += det.observe(cl.snapshot(t), t)
        t += 0.25
    assert [e.nodes for e in found if e.kind == NODE_SILENT] == [("node1",)]


def test_ranks_exiting_one_by_one_after_the_last_step_are_not_a_global_stall():
    """Seen under load: after the last step the ranks tear down (barrier, destroy_process_group) for more than
    the step timeout and exit one by one; that is the end of the run, not a stall."""
    from supervisor.client.layout import RANK_FLAG_EXITING

    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))  # the last step is done; silent from here on
    cl.state[1], cl.flags[1] = "gone", RANK_FLAG_EXITING  # exited after its atexit ran (code unknown)
    found = [e for _, e in run(det, cl, 30, 60)]
    assert [e.kind for e in found] == [RANK_EXITED] and found[0].ranks == (1,)


def test_a_rank_whose_atexit_ran_is_not_hung_but_a_rank_behind_a_finished_peer_is():
    from supervisor.client.layout import RANK_FLAG_EXITING

    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))
    cl.flags = {r: RANK_FLAG_EXITING for r in range(4)}  # all in their interpreter's exit, none gone yet
    assert run(det, cl, 30, 60) == []
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))
    cl.step[3] -= 1  # behind the peer that finished: it is late, not finishing
    cl.state[0], cl.flags[0] = "gone", RANK_FLAG_EXITING
    found = [e for _, e in run(det, cl, 30, 40)]
    assert [e.kind for e in found] == [RANK_EXITED, RANK_HANG] and found[1].ranks == (3,)


def test_a_crashed_peer_gives_no_finish_allowance():
    det, cl = Detector(fast_config()), Cluster()
    run(det, cl, 0, 30)
    cl.frozen.update(range(4))
    cl.state[2] = "gone"  # no exit flag, code unknown: a crash, not a finish
    kinds = [e.kind for _, e in run(det, cl, 30, 40)]
    assert kinds == [RANK_EXITED, GLOBAL_STALL]
