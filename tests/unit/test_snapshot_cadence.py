"""The memory tier's "auto" cadence (decisions/snapshot_cadence.py): the blocking copies stay within their share
of the training's time with the fewest steps between snapshots, whatever the measured costs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.snapshot_cadence import BUDGET, MOST, every_k_steps, parse_every


@given(cost=st.floats(1e-6, 100), step=st.floats(1e-4, 100))
def test_the_cadence_is_the_fewest_steps_within_the_budget(cost: float, step: float) -> None:
    k = every_k_steps(cost, step)
    assert 1 <= k <= MOST
    if k < MOST:
        assert cost <= BUDGET * k * step * (1 + 1e-6)  # within the budget
    if k > 1:
        assert cost > BUDGET * (k - 1) * step * (1 - 1e-6)  # and one step fewer would not be


def test_odd_measurements_give_a_safe_cadence() -> None:
    assert every_k_steps(0.0, 0.1) == 1 and every_k_steps(math.nan, 0.1) == 1
    assert every_k_steps(0.01, 0.0) == MOST
    assert every_k_steps(0.001, 0.1) == 1  # a 1 ms copy on a 100 ms step: every step
    assert every_k_steps(0.05, 0.1) == 25


def test_the_setting_is_auto_or_a_whole_number() -> None:
    assert parse_every("auto") is None and parse_every("") is None and parse_every(" 4 ") == 4
    for bad in ("0", "-1", "2.5", "often"):
        with pytest.raises(ValueError, match="neither 'auto' nor a whole number"):
            parse_every(bad)
