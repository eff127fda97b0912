"""Lemon detection across campaigns (supervisor/decisions/lemon.py): the Poisson tail, and replayed fleet
histories of many jobs — a real lemon is named, healthy fleets are not (at the stated false-alarm rate), one
user's crashing program never makes a lemon, and unknown exposure is never judged."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.lemon import LemonConfig, NodeFailure, poisson_sf, score_nodes

DAY = 86400.0
NOW = 1_800_000_000.0


def naive_sf(k: int, mu: float) -> float:
    return 1.0 - math.fsum(math.exp(-mu) * mu**j / math.factorial(j) for j in range(k))


@given(st.integers(0, 40), st.floats(0.01, 30))
def test_the_poisson_tail_matches_the_textbook_sum(k: int, mu: float) -> None:
    assert poisson_sf(k, mu) == pytest.approx(naive_sf(k, mu), abs=1e-9)


@given(st.integers(0, 200), st.floats(1e-6, 500), st.floats(1e-6, 500))
def test_the_tail_is_a_probability_falling_in_k_and_rising_in_mu(k: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    p = poisson_sf(k, low)
    assert 0.0 <= p <= 1.0
    assert poisson_sf(k + 1, low) <= p + 1e-12
    assert poisson_sf(k, high) >= p - 1e-12


def test_the_far_tail_is_tiny_but_not_zero() -> None:
    """Where a lemon's p-value lies: 1 - head would round to 0 (or below)."""
    p = poisson_sf(12, 0.05)
    assert 0 < p < 1e-20
    assert p == pytest.approx(math.exp(-0.05) * 0.05**12 / math.factorial(12), rel=1e-3)


def fleet(seed: int, nodes: int = 200, rate_per_h: float = 0.5 / (30 * 24), lemon: str | None = None,
          lemon_factor: float = 20.0) -> tuple[list[NodeFailure], dict[str, float | None]]:  # fmt: skip
    """A month of jobs on ``nodes`` nodes, each in jobs 60-100 % of the time; failures at ``rate_per_h`` per
    node-hour (about one every two months per node), ``lemon`` failing ``lemon_factor`` times as often; each
    failure in the job of one of 8 users."""
    rng = random.Random(seed)
    failures, exposure = [], {}
    for i in range(nodes):
        node = f"n{i:04d}"
        hours = 30 * 24 * rng.uniform(0.6, 1.0)
        exposure[node] = hours
        rate = rate_per_h * (lemon_factor if node == lemon else 1.0)
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t > hours:
                break
            failures.append(NodeFailure(node, NOW - 30 * DAY + t * 3600, "hardware", f"user{rng.randrange(8)}",
                                        f"job{rng.randrange(10**6)}"))  # fmt: skip
    return failures, exposure


MONTHLY = 3.0 / (30 * 24)  # three failures per node-month: enough that the Poisson test, not min_failures, decides


def test_a_lemon_in_a_fleet_of_200_is_named_with_its_evidence() -> None:
    """A node failing 6x as often as the rest, in 10 replayed fleets: named in most (the test's power), and no
    other node is ever named beside it."""
    found = 0
    for seed in range(10):
        named = [s for s in score_nodes(*fleet(seed, rate_per_h=MONTHLY, lemon="n0042", lemon_factor=6.0), NOW)
                 if s.lemon]  # fmt: skip
        assert [s.node for s in named] in ([], ["n0042"]), named
        if named:
            found += 1
            top = named[0]
            assert top.failures >= 3 and top.users >= 2 and top.p_value is not None and top.p_value < 0.01 / 200
            assert "failures in" in top.why and "expected at the fleet's rate" in top.why
    assert found >= 8


def test_healthy_fleets_name_nobody_at_the_stated_rate() -> None:
    """50 replayed healthy fleets of 200 nodes: the Bonferroni bar keeps the chance of naming anybody in one look
    at about alpha (1 %); more than 3 fleets in 50 would say the test is wrong. The per-node bar alone (p < 1 %)
    would have named dozens of healthy nodes in the same fleets."""
    flagged = naive = 0
    for seed in range(100, 150):
        scores = score_nodes(*fleet(seed, rate_per_h=MONTHLY), NOW)
        flagged += any(s.lemon for s in scores)
        naive += sum(s.p_value is not None and s.p_value < 0.01 and s.failures >= 3 for s in scores)
    assert flagged <= 3 and naive >= 20


def test_one_users_crashing_program_never_makes_a_lemon() -> None:
    failures, exposure = fleet(2)
    failures += [NodeFailure("n0007", NOW - i * 3600, "hardware", "mallory", f"m{i}") for i in range(12)]
    score = next(s for s in score_nodes(failures, exposure, NOW) if s.node == "n0007")
    assert not score.lemon and score.p_value is not None and score.p_value < 1e-6
    assert "not counted" in score.why


def test_unknown_exposure_is_not_judged_and_old_failures_leave_the_window() -> None:
    failures, exposure = fleet(3, lemon="n0001")
    exposure["n0001"] = None
    score = next(s for s in score_nodes(failures, exposure, NOW) if s.node == "n0001")
    assert not score.lemon and score.p_value is None and "unknown" in score.why
    later = score_nodes(failures, {**exposure, "n0001": 600.0}, NOW + 60 * DAY)
    assert not any(s.lemon or s.failures for s in later)


def test_a_bad_node_does_not_raise_its_own_bar() -> None:
    """Two nodes: judged against the whole fleet's rate, a node holding most failures looks ordinary."""
    failures = [NodeFailure("bad", NOW - i * 3600, "hardware", f"u{i % 3}", f"j{i}") for i in range(10)]
    failures.append(NodeFailure("good", NOW - 5, "hardware", "u0", "j99"))
    scores = {s.node: s for s in score_nodes(failures, {"bad": 500.0, "good": 500.0}, NOW,
                                             LemonConfig(alpha=0.05))}  # fmt: skip
    assert scores["bad"].expected == pytest.approx(1.0) and scores["bad"].lemon
    assert not scores["good"].lemon


def test_a_fleet_too_small_to_give_a_rate_judges_nobody() -> None:
    failures = [NodeFailure("a", NOW - i, "hardware", f"u{i}", f"j{i}") for i in range(5)]
    (score,) = [s for s in score_nodes(failures, {"a": 100.0, "b": 2.0}, NOW) if s.node == "a"]
    assert not score.lemon and "no rate to judge against" in score.why


@pytest.mark.parametrize("bad", [{"alpha": 0.0}, {"alpha": 1.5}, {"window_s": -1.0}, {"min_failures": 0},
                                 {"min_fleet_hours": float("nan")}])  # fmt: skip
def test_bad_settings_are_refused_with_the_setting_named(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="site.lemon_"):
        LemonConfig(**bad)  # type: ignore[arg-type]
