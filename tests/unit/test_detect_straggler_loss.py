"""Stragglers (persistent slowdown vs peers) and loss anomalies (NaN/Inf, z-score spikes)."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.detect import (
    LOSS_DIVERGED,
    LOSS_SPIKE,
    NONFINITE_LOSS,
    STRAGGLER,
    LaunchView,
    LossConfig,
    LossDetector,
    NodeRanks,
    RankView,
    StragglerConfig,
    StragglerDetector,
)
from supervisor.decisions.detect.straggler import median_without


def table(ewmas, step=10):
    views = tuple(
        RankView(r, f"node{r // 2 + 1}", 100 + r, step, "step", 0.1, ewma_s=e)
        for r, e in enumerate(ewmas)
    )
    return LaunchView((NodeRanks("all", 0.0, views),))


def test_a_persistently_slow_rank_is_reported_once_after_m_checks():
    det = StragglerDetector(StragglerConfig(factor=1.5, consecutive=4, interval_s=5.0))
    found = []
    for i in range(40):  # every second for 40 s: checks at 0, 5, 10, ...
        found += [(i, e) for e in det.observe(table([1.0, 1.0, 1.1, 2.0]), float(i))]
    assert len(found) == 1
    t, event = found[0]
    assert t == 15 and event.kind == STRAGGLER and event.ranks == (3,) and event.nodes == ("node2",)
    assert event.value == 2.0 and event.threshold == pytest.approx(1.5)


def test_a_slow_blip_does_not_make_a_straggler():
    det = StragglerDetector(StragglerConfig(consecutive=3, interval_s=0))
    seq = [[1, 1, 1, 3], [1, 1, 1, 3], [1, 1, 1, 1], [1, 1, 1, 3], [1, 1, 1, 3], [1, 1, 1, 1]]
    assert [e for i, ew in enumerate(seq) for e in det.observe(table(ew), float(i))] == []


@settings(max_examples=60)
@given(
    ewmas=st.lists(st.floats(min_value=0.01, max_value=100), min_size=3, max_size=40),
    factor=st.floats(min_value=1.1, max_value=4),
)
def test_ranks_within_factor_of_each_other_are_never_stragglers(ewmas, factor):
    lo = min(ewmas)
    ewmas = [min(e, lo * factor) for e in ewmas]
    det = StragglerDetector(StragglerConfig(factor=factor, consecutive=1, interval_s=0))
    assert det.observe(table(ewmas), 0.0) == []


@given(
    values=st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=2, max_size=30), pick=st.integers(0)
)
def test_median_without_matches_the_naive_computation(values, pick):
    ordered = sorted(values)
    x = ordered[pick % len(ordered)]
    rest = list(ordered)
    rest.remove(x)
    assert median_without(ordered, x) == pytest.approx(statistics.median(rest))


def loss_table(losses, step):
    views = tuple(RankView(r, "node1", 1, step, "step", 0.1, loss=v) for r, v in enumerate(losses))
    return LaunchView((NodeRanks("node1", 0.0, views),))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_loss_on_any_rank_is_a_fault_reported_once(bad):
    det = LossDetector()
    assert det.observe(loss_table([1.0, 1.0], 1), 1.0) == []
    found = det.observe(loss_table([1.0, bad], 2), 2.0) + det.observe(loss_table([1.0, bad], 3), 3.0)
    assert [(e.kind, e.ranks) for e in found] == [(NONFINITE_LOSS, (1,))]
    assert math.isnan(found[0].value) if math.isnan(bad) else found[0].value == bad


def test_a_loss_spike_is_a_warning_with_its_z_score():
    det = LossDetector(LossConfig(window=50, min_samples=20, z=6.0, cooldown_steps=10))
    for step in range(1, 60):
        loss = 2.0 + 0.01 * math.sin(step)  # small wiggle
        assert det.observe(loss_table([loss], step), float(step)) == []
    spike = det.observe(loss_table([5.0], 60), 60.0)
    assert [e.kind for e in spike] == [LOSS_SPIKE] and spike[0].value > 6.0
    assert det.observe(loss_table([5.0], 61), 61.0) == []  # cooldown: no alert storm


def test_a_flat_loss_repeating_is_not_a_spike():
    det = LossDetector(LossConfig(window=10, min_samples=5))
    assert [e for s in range(1, 100) for e in det.observe(loss_table([0.5], s), float(s))] == []


def test_only_new_steps_count_so_resampling_a_stale_value_adds_nothing():
    det = LossDetector(LossConfig(window=10, min_samples=5))
    for t in range(20):
        det.observe(loss_table([1.0], 7), float(t))
    assert len(det.state.windows[0]) == 1


@settings(max_examples=60)
@given(losses=st.lists(st.floats(min_value=0.0, max_value=1e3), min_size=11, max_size=80))
def test_a_loss_never_above_the_recent_maximum_is_never_a_spike(losses):
    """(max - mean)/std <= sqrt(n-1) for any n values, so with z > sqrt(window-1) no such value can fire."""
    det = LossDetector(LossConfig(window=10, min_samples=10, z=6.0, relative_floor=0.0))
    window: list[float] = []
    for step, loss in enumerate(losses, start=1):
        if len(window) >= 10:
            loss = min(loss, max(window[-10:]))
        found = det.observe(loss_table([loss], step), float(step))
        assert [e for e in found if e.kind == LOSS_SPIKE] == []
        window.append(loss)


def test_bad_loss_config_names_the_key():
    with pytest.raises(ValueError, match="loss_min_samples"):
        LossConfig(window=10, min_samples=20)
    with pytest.raises(ValueError, match="straggler_factor"):
        StragglerConfig(factor=1.0)


def _after_a_spike(then: list[float], diverged_steps: int = 5) -> list:
    det = LossDetector(LossConfig(window=50, min_samples=20, z=6.0, cooldown_steps=100, diverged_steps=diverged_steps))
    for step in range(1, 60):
        det.observe(loss_table([2.0 + 0.01 * math.sin(step)], step), float(step))
    found = det.observe(loss_table([5.0], 60), 60.0)
    for i, loss in enumerate(then, start=61):
        found += det.observe(loss_table([loss], i), float(i))
    return found


def test_a_spike_the_loss_never_comes_back_from_is_a_divergence_that_names_the_spikes_step():
    found = _after_a_spike([4.0, 4.5, 3.9, 4.2, 4.4, 4.1])
    assert [e.kind for e in found] == [LOSS_SPIKE, LOSS_DIVERGED]
    assert found[1].is_fault and found[1].value == 59  # the last step seen with a normal loss
    assert "did not come back after its spike at step 60 (the last normal loss seen: step 59)" in found[1].evidence[0]
    from supervisor.decisions.classify import Evidence, classify

    assert classify(Evidence(detections=((61.0, found[1]),))).cls == "numerical"  # rolled back like a NaN


def test_a_spike_the_loss_comes_back_from_stays_a_warning_and_divergence_is_off_by_default():
    assert [e.kind for e in _after_a_spike([4.0, 4.5, 2.0, 4.2, 4.4, 4.1, 4.0, 4.3])] == [LOSS_SPIKE]
    assert [e.kind for e in _after_a_spike([4.0] * 20, diverged_steps=0)] == [LOSS_SPIKE]
