"""Learned timeouts: conservative quantiles, floors, warm-up and phase allowances."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.detect import LogHistogram, PhaseTimeouts, TimeoutConfig

_durations = st.lists(st.floats(min_value=1e-3, max_value=1e4, allow_nan=False), min_size=1, max_size=300)


@given(values=_durations, q=st.sampled_from([0.5, 0.9, 0.99]))
def test_histogram_quantile_is_conservative_and_within_one_bucket(values, q):
    hist = LogHistogram()
    for v in values:
        hist.add(v)
    true = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
    estimate = hist.quantile(q)
    assert true * (1 - 1e-9) <= estimate <= max(values) * (1 + 1e-9)
    assert estimate <= true * 1.08 * (1 + 1e-9)


def test_histogram_ignores_garbage_and_stays_bounded():
    hist = LogHistogram()
    for v in (float("nan"), float("inf"), -1.0):
        hist.add(v)
    assert hist.count == 0 and hist.quantile(0.99) == 0.0
    for _ in range(50_000):
        hist.add(1.0, decay_cap=1000.0)
    assert hist.total <= 1000.0 and len(hist.weights) < 400


@settings(max_examples=50)
@given(values=_durations, floor=st.floats(min_value=0.1, max_value=100))
def test_step_timeout_is_never_below_the_floor(values, floor):
    timeouts = PhaseTimeouts(TimeoutConfig(step_floor_s=floor, warmup_samples=1))
    for v in values:
        timeouts.observe("step", v)
    assert timeouts.timeout("step") >= floor


def test_step_timeout_is_k_times_p99_after_warmup():
    timeouts = PhaseTimeouts(TimeoutConfig(step_floor_s=1.0, step_k=3.0, warmup_samples=20, warmup_timeout_s=300))
    for _ in range(19):
        timeouts.observe("step", 2.0)
    assert timeouts.timeout("step") == 300  # still warming up
    timeouts.observe("step", 2.0)
    assert 6.0 <= timeouts.timeout("step") <= 6.0 * 1.08


def test_init_and_first_step_get_the_long_allowance():
    timeouts = PhaseTimeouts(TimeoutConfig(init_allowance_s=900, warmup_samples=1))
    timeouts.observe("step", 1.0)
    assert timeouts.timeout("init") == 900
    assert timeouts.timeout(None) == 900
    assert timeouts.timeout("step", first_step_done=False) == 900
    assert timeouts.timeout("step") < 900


def test_checkpoint_allowance_is_generous_until_learned():
    timeouts = PhaseTimeouts(TimeoutConfig(checkpoint_allowance_s=900, phase_floor_s=60, phase_k=3))
    assert timeouts.timeout("checkpoint") == 900
    timeouts.observe("checkpoint", 40.0)
    assert 120 <= timeouts.timeout("checkpoint") <= 130
    timeouts.observe("eval", 1.0)
    assert timeouts.timeout("eval") == 60  # floor
    assert set(timeouts.learned()) == {"checkpoint", "eval"}


@pytest.mark.parametrize(
    "kwargs,key",
    [({"step_floor_s": 0}, "step_floor_s"), ({"quantile": 1.0}, "quantile"), ({"warmup_samples": 0}, "warmup")],
)
def test_bad_timeout_config_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        TimeoutConfig(**kwargs)


def test_detect_config_from_the_flat_config_table():
    from supervisor.decisions.detect import DetectConfig

    config = DetectConfig.from_mapping({"step_floor_s": 3, "node_silence_s": 20.0, "straggler_factor": 2.0,
                                        "loss_window": 30})  # fmt: skip
    assert config.timeouts.step_floor_s == 3 and config.hang.node_silence_s == 20.0
    assert config.straggler.factor == 2.0 and config.loss.window == 30
    with pytest.raises(ValueError, match="detect.step_flor_s: unknown setting"):
        DetectConfig.from_mapping({"step_flor_s": 3})
    with pytest.raises(ValueError, match="detect.loss_window must be a whole number"):
        DetectConfig.from_mapping({"loss_window": 2.5})
    with pytest.raises(ValueError, match="detect.step_k must be a number"):
        DetectConfig.from_mapping({"step_k": "3"})
    with pytest.raises(ValueError, match="detect.step_floor_s"):
        DetectConfig.from_mapping({"step_floor_s": -1})


def test_learned_timeouts_survive_a_round_trip_through_the_journal():
    """A requeued run restores what the previous run learned (via a JSON journal event), instead of
    falling back to the long warm-up timeout right when a fresh hang is most likely."""
    import json

    from supervisor.decisions.detect.timeouts import PhaseTimeouts

    learned = PhaseTimeouts()
    for i in range(200):
        learned.observe("step", 0.5 + (i % 7) * 0.01)
    learned.observe("checkpoint", 12.0)
    fresh = PhaseTimeouts()
    fresh.restore(json.loads(json.dumps(learned.to_dict())))
    assert fresh.learned() == learned.learned()
    assert fresh.timeout("step") < fresh.config.warmup_timeout_s
    broken = PhaseTimeouts()
    broken.restore({"step": {"buckets": "nonsense"}, "eval": 3})
    assert broken.learned() == {}  # malformed: relearn, never crash
