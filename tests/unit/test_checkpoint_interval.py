"""Young/Daly checkpoint-interval advice: the issue's arithmetic, Daly's corrections, the config key."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import config
from supervisor.decisions import campaign_state
from supervisor.decisions import checkpoint_interval as ci
from supervisor.errors import ConfigError

M = 3.1 * 3600  # Llama 3 at 16,384 GPUs: 419 interruptions in 54 days


@pytest.mark.parametrize(("delta", "restart", "expected"), [(1.0, 60.0, 0.981), (5.0, 60.0, 0.965), (30.0, 300.0, 0.90)])
def test_issue_arithmetic(delta: float, restart: float, expected: float) -> None:
    assert ci.best_goodput(delta, restart, M) == pytest.approx(expected, abs=0.001)


def test_young_interval_maximises_first_order_goodput() -> None:
    tau = ci.young_interval(1.0, M)
    assert tau == pytest.approx(math.sqrt(2 * M))
    best = ci.goodput_first_order(tau, 1.0, 60.0, M)
    assert best == pytest.approx(ci.best_goodput(1.0, 60.0, M))
    assert ci.goodput_first_order(tau * 1.3, 1.0, 60.0, M) < best
    assert ci.goodput_first_order(tau / 1.3, 1.0, 60.0, M) < best


@given(st.floats(0.01, 600), st.floats(600, 1e6))
def test_daly_interval_is_close_to_young_and_optimal_in_daly_model(delta: float, mtbf: float) -> None:
    daly, young = ci.daly_interval(delta, mtbf), ci.young_interval(delta, mtbf)
    assert 0 < daly
    assert abs(daly - young) <= delta + 0.5 * young * math.sqrt(delta / (2 * mtbf)) + 1e-9
    g = ci.goodput_daly(daly, delta, 0.0, mtbf)
    assert g >= ci.goodput_daly(young, delta, 0.0, mtbf) - 1e-3
    assert g >= ci.goodput_daly(daly * 2, delta, 0.0, mtbf)
    assert g >= ci.goodput_daly(daly / 2, delta, 0.0, mtbf)


def test_daly_interval_falls_back_to_mtbf_when_stall_dominates() -> None:
    assert ci.daly_interval(100.0, 40.0) == 40.0


def test_advice_prefers_observed_then_configured_then_site_prior() -> None:
    observed = ci.advise("auto", delta_s=1.0, restart_s=60.0, nodes=2048, interruption_times=[1, 2, 3, 4],
                         observed_s=4 * M)  # fmt: skip
    assert observed.mtbf_source == "observed" and observed.mtbf_s == pytest.approx(M)
    assert observed.interval_s == pytest.approx(ci.daly_interval(1.0, M))
    assert observed.predicted_goodput == pytest.approx(0.981, abs=0.001)
    few = ci.advise("auto", delta_s=1.0, restart_s=60.0, nodes=2048, interruption_times=[1], observed_s=M,
                    prior_mtbf_s=7200.0)  # fmt: skip
    assert (few.mtbf_source, few.mtbf_s) == ("configured prior", 7200.0)
    site = ci.advise("auto", delta_s=1.0, restart_s=None, nodes=2048)
    assert site.mtbf_source == "site prior"
    assert site.mtbf_s == pytest.approx(86400 / (6.5e-3 * 2048))  # ~1.8 h: Meta's projection at 16k GPUs


def test_a_prior_gives_way_once_the_campaign_ran_longer_than_it_says() -> None:
    """Fewer than 3 interruptions in T seconds: the MTBF is no less than T / (n + 1), whatever the prior (a
    campaign whose faults the memory tier answers must not checkpoint at a pessimistic prior's pace for weeks)."""
    weeks = 14 * 86400.0
    late = ci.advise("auto", delta_s=1.0, restart_s=60.0, nodes=2048, interruption_times=[5.0], observed_s=weeks)
    assert (late.mtbf_source, late.mtbf_s) == ("observed (lower bound)", weeks / 2)
    early = ci.advise("auto", delta_s=1.0, restart_s=60.0, nodes=2048, observed_s=600.0)
    assert early.mtbf_source == "site prior"


def test_advice_modes() -> None:
    assert ci.advise("off", delta_s=1.0, restart_s=60.0, nodes=4).interval_s is None
    first = ci.advise("auto", delta_s=None, restart_s=None, nodes=4)  # nothing measured yet: measure it early
    assert first.interval_s == ci.FIRST_ASK_S and first.mode == "auto" and first.predicted_goodput is None
    fixed = ci.advise(1800, delta_s=30.0, restart_s=300.0, nodes=4, prior_mtbf_s=M)
    assert fixed.mode == "fixed" and fixed.interval_s == 1800.0
    assert fixed.predicted_goodput is not None and fixed.optimum_goodput is not None
    assert fixed.predicted_goodput < fixed.optimum_goodput
    assert ci.due(fixed, 1800.0) and not ci.due(fixed, 1799.0)
    assert not ci.due(ci.advise("off", delta_s=1.0, restart_s=1.0, nodes=1), 1e9)


@pytest.mark.parametrize("value", ["sometimes", 0, -5, True, float("nan"), [60]])
def test_bad_settings_are_one_line_config_errors(value: object) -> None:
    with pytest.raises(ci.IntervalSettingError):
        ci.parse_setting(value)
    with pytest.raises(ConfigError, match="checkpoint_interval"):
        config.from_mapping({"run": {"checkpoint_interval": value}})


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("OFF", "off"), (1800, 1800.0), (90.5, 90.5)])
def test_config_key(value: object, expected: object) -> None:
    assert config.from_mapping({"run": {"checkpoint_interval": value}}).run.checkpoint_interval == expected
    assert config.from_mapping({}).run.checkpoint_interval == "off"


def test_inputs_folded_from_a_journal() -> None:
    from supervisor.decisions import events as ev

    t0 = 1000.0
    journal = [
        ev.campaign_started(t0, "/c", ["train"]),
        ev.attempt_started(t0, "7", 0, ["n1"], None),
        ev.step_launched(t0 + 10, 1, ["n1"]),
        {**ev.checkpoint_committed(t0 + 100, 10, "/ck/10"), "stall_s": 0.8},
        ev.checkpoint_committed(t0 + 200, 20, "/ck/20", duration_s=1.2),
        ev.checkpoint_committed(t0 + 300, 30, "/ck/30"),  # no measurement: ignored
        ev.interruption_event(t0 + 410, "hang", ["n1"], 0.9, ["silent"]),
        ev.step_launched(t0 + 470, 2, ["n1"]),  # restart 60 s
        ev.interruption_event(t0 + 870, "hardware", ["n1"], 0.9, ["Xid"]),
        ev.step_launched(t0 + 910, 3, ["n1"]),  # restart 40 s
        ev.interruption_event(t0 + 1010, "completed", [], 0.95, ["exit 0"]),
        ev.campaign_ended(t0 + 1010, "completed"),
    ]
    m = campaign_state.fold(journal).interval.measured(9999.0)
    assert m.delta_s == pytest.approx(1.0) and m.restart_s == pytest.approx(50.0)
    assert m.interruption_times == (t0 + 410, t0 + 870)
    assert m.observed_s == pytest.approx(400 + 400 + 100)
    advice = ci.advise_measured("auto", m, nodes=1, prior_mtbf_s=M)
    assert advice.mtbf_source == "configured prior" and advice.interval_s == pytest.approx(ci.daly_interval(1.0, M))
    running = campaign_state.fold(journal[:4]).interval.measured(t0 + 110)
    assert running.observed_s == pytest.approx(100.0) and running.restart_s is None


def test_faults_recovered_from_node_memory_do_not_shorten_the_filesystem_interval() -> None:
    """With the memory tier a relaunch that resumed from node memory lost a step, not the filesystem interval's
    work: only the faults whose next launch used the filesystem count toward the MTBF the interval is planned for,
    so the filesystem checkpoints get rarer as the memory tier takes the faults."""
    from supervisor.decisions import events as ev

    def launched(t: float, n: int, tier: str) -> dict:
        return {**ev.step_launched(t, n, ["n1"]), "resume_tier": tier}

    t0, journal = 1000.0, []
    journal += [ev.campaign_started(t0, "/c", ["train"]), ev.attempt_started(t0, "7", 0, ["n1"], None),
                launched(t0 + 10, 1, "fresh")]  # fmt: skip
    for i, tier in enumerate(["memory", "memory", "filesystem", "memory", "filesystem", "filesystem"]):
        journal += [ev.interruption_event(t0 + 1000 * (i + 1), "app_error", [], 0.9, ["x"]),
                    launched(t0 + 1000 * (i + 1) + 30, i + 2, tier)]  # fmt: skip
    m = campaign_state.fold(journal).interval.measured(t0 + 7000)
    assert m.interruption_times == (t0 + 3000, t0 + 5000, t0 + 6000)
    assert m.restart_s == pytest.approx(30.0), "every relaunch's restart still counts"
    # A requeue whose next job resumed from the snapshot flushed before it still counts: the flush can fail.
    journal += [ev.interruption_event(t0 + 8000, "node_failure", ["n1"], 0.9, ["x"]),
                ev.attempt_ended(t0 + 8001, "7", "node_failure", ["n1"], ["x"], 7000),
                ev.attempt_started(t0 + 8100, "7", 1, ["n2"], None), launched(t0 + 8130, 9, "memory"),
                ev.interruption_event(t0 + 9000, "app_error", [], 0.9, ["x"]), launched(t0 + 9030, 10, "memory")]  # fmt: skip
    m = campaign_state.fold(journal).interval.measured(t0 + 10000)
    assert m.interruption_times == (t0 + 3000, t0 + 5000, t0 + 6000, t0 + 8000)
    # ... unless the interrupted launch had a snapshot persisted while it ran: a failed flush would have left that.
    journal += [ev.memory_persist(t0 + 9500, 880, "persisted"),
                ev.interruption_event(t0 + 10000, "node_failure", ["n2"], 0.9, ["x"]),
                ev.attempt_ended(t0 + 10001, "7", "node_failure", ["n2"], ["x"], 900),
                ev.attempt_started(t0 + 10100, "7", 2, ["n3"], None), launched(t0 + 10130, 11, "memory"),
                ev.memory_persist(t0 + 10500, None, "a failed persist is none"),
                ev.interruption_event(t0 + 11000, "node_failure", ["n3"], 0.9, ["x"]),
                ev.attempt_ended(t0 + 11001, "7", "node_failure", ["n3"], ["x"], 990),
                ev.attempt_started(t0 + 11100, "7", 3, ["n4"], None), launched(t0 + 11130, 12, "memory")]  # fmt: skip
    m = campaign_state.fold(journal).interval.measured(t0 + 12000)
    assert m.interruption_times == (t0 + 3000, t0 + 5000, t0 + 6000, t0 + 8000, t0 + 11000)
