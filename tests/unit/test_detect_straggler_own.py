"""The straggler detector on own times (step time less collective waits): in synchronous data parallelism every
rank's step period is the same, so only own times can name the slow rank; step periods are the fallback when not
every rank measures its own time."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.detect import (
    STRAGGLER,
    LaunchView,
    NodeRanks,
    RankView,
    StragglerConfig,
    StragglerDetector,
)
from supervisor.decisions.detect.straggler import OWN, PERIOD


def sync_table(own: list[float | None], period: float = 0.8) -> LaunchView:
    """Every rank steps at the same period (they wait for the slowest); own times as given (None: not measured)."""
    views = tuple(RankView(r, f"node{r + 1}", 100 + r, 10, "step", 0.1, ewma_s=period, own_s=o)
                  for r, o in enumerate(own))  # fmt: skip
    return LaunchView((NodeRanks("all", 0.0, views),))


def run(det: StragglerDetector, tables: list[LaunchView]) -> list:
    return [e for i, t in enumerate(tables) for e in det.observe(t, float(i))]


def test_the_rank_everyone_waits_for_is_named_by_its_own_time():
    det = StragglerDetector(StragglerConfig(consecutive=2, interval_s=0))
    found = run(det, [sync_table([0.3, 0.31, 0.72])] * 4)
    assert len(found) == 1
    (event,) = found
    assert event.kind == STRAGGLER and event.ranks == (2,) and event.nodes == ("node3",)
    assert event.metric == OWN and event.value == 0.72 and event.threshold == 1.5 * 0.305
    assert "own time per step" in event.evidence[0] and "step period 0.8s" in event.evidence[0]


def test_without_own_times_everywhere_the_periods_are_compared_as_before():
    det = StragglerDetector(StragglerConfig(consecutive=1, interval_s=0))
    assert run(det, [sync_table([0.3, None, 0.72])]) == []  # equal periods: nothing to see (the known limit)
    views = tuple(RankView(r, f"node{r + 1}", 1, 10, "step", 0.1, ewma_s=p) for r, p in enumerate([1.0, 1.0, 2.0]))
    (event,) = det.observe(LaunchView((NodeRanks("all", 0.0, views),)), 1.0)
    assert event.metric == PERIOD and event.ranks == (2,)


def test_a_switch_of_metric_starts_the_streaks_over():
    det = StragglerDetector(StragglerConfig(consecutive=2, interval_s=0))
    slow_period = LaunchView((NodeRanks("all", 0.0, tuple(
        RankView(r, f"node{r + 1}", 1, 10, "step", 0.1, ewma_s=p) for r, p in enumerate([1.0, 1.0, 2.0]))),))  # fmt: skip
    assert run(det, [slow_period, sync_table([0.3, 0.3, 0.72])]) == []  # one check each: no streak of 2
    assert det.state.metric == OWN and det.state.streaks == {2: 1}


def test_ranks_outside_the_step_phase_or_silent_are_left_out():
    det = StragglerDetector(StragglerConfig(consecutive=1, interval_s=0))
    views = (RankView(0, "n1", 1, 10, "step", 0.1, ewma_s=1.0, own_s=0.3),
             RankView(1, "n2", 1, 10, "step", 0.1, ewma_s=1.0, own_s=0.3),
             RankView(2, "n3", 1, 10, "checkpoint", 0.1, ewma_s=1.0, own_s=0.9),
             RankView(3, "n4", 1, 10, "step", 99.0, ewma_s=1.0, own_s=0.9))  # fmt: skip
    assert det.observe(LaunchView((NodeRanks("all", 0.0, views),)), 0.0) == []  # 2 ranks left: fewer than min_ranks


@settings(max_examples=80, deadline=None)
@given(ranks=st.integers(3, 64), base=st.floats(0.001, 100.0), noise=st.floats(0.0, 0.19), seed=st.integers(0, 2**32))
def test_noise_within_nineteen_percent_never_makes_a_straggler(ranks, base, noise, seed):
    """Ranks on a loaded machine: at each check every rank's own time wanders up to +-noise around a common base;
    (1 + 0.19) / (1 - 0.19) < 1.5, the default factor, so not even one check fires."""
    rng = random.Random(seed)
    det = StragglerDetector(StragglerConfig(consecutive=1, interval_s=0))
    tables = [sync_table([base * (1 + rng.uniform(-noise, noise)) for _ in range(ranks)]) for _ in range(10)]
    assert run(det, tables) == []


@settings(max_examples=80, deadline=None)
@given(ranks=st.integers(3, 64), base=st.floats(0.001, 100.0), slow=st.data(), ratio=st.floats(1.6, 50.0),
       consecutive=st.integers(1, 6))  # fmt: skip
def test_one_persistently_slow_rank_is_named_once_after_the_consecutive_checks(ranks, base, slow, ratio,
                                                                               consecutive):  # fmt: skip
    who = slow.draw(st.integers(0, ranks - 1))
    det = StragglerDetector(StragglerConfig(consecutive=consecutive, interval_s=0))
    own = [base * ratio if r == who else base for r in range(ranks)]
    found = [(i, e) for i in range(consecutive + 5) for e in det.observe(sync_table(own, base * ratio), float(i))]
    assert [(i, e.ranks, e.nodes) for i, e in found] == [(consecutive - 1, (who,), (f"node{who + 1}",))]
