"""Policy: the response table per class, budgets that stop bug loops, bounded backoff, config validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Interruption
from supervisor.decisions.policy import (
    ALERT,
    AWAIT_REQUEUE,
    BACKOFF,
    CHECKPOINT_NOW,
    DRAIN,
    DUMP_STACKS,
    FINISH,
    HOLD,
    KILL_STEP,
    MARK_SUSPECT,
    REQUEUE,
    RESTART_IN_ALLOCATION,
    STOP,
    STOP_STEP,
    Allocation,
    History,
    PolicyConfig,
    backoff_seconds,
    decide,
    respond_to_warning,
)

ALLOC = Allocation(nodes=("node1", "node2", "node3"), needed=2, step_running=True)
TIGHT = Allocation(nodes=("node1", "node2"), needed=2, step_running=True)


def interruption(cls, blamed=(), evidence=("because",)):
    return Interruption(cls, tuple(blamed), 0.9, tuple(evidence))


def kinds(decision):
    return [a.kind for a in decision.actions]


def test_preemption_checkpoints_and_lets_slurm_requeue_without_blame():
    d = decide(interruption(ev.PREEMPTION), History(), ALLOC)
    assert kinds(d) == [ALERT, CHECKPOINT_NOW, AWAIT_REQUEUE] and d.state == "pending"
    assert d.actions[0].tier == "L1"


def test_timeout_checkpoints_then_requeues():
    d = decide(interruption(ev.TIMEOUT), History(), ALLOC)
    assert kinds(d) == [ALERT, CHECKPOINT_NOW, REQUEUE]
    assert d.actions[-1].params["after_checkpoint"] is True


def test_hang_is_l4_then_restart_in_allocation_excluding_the_node_when_a_spare_exists():
    d = decide(interruption(ev.HANG, ["node2"]), History(), ALLOC)
    assert kinds(d) == [ALERT, DUMP_STACKS, KILL_STEP, MARK_SUSPECT, RESTART_IN_ALLOCATION]
    assert d.actions[0].tier == "L4"
    restart = d.actions[-1]
    assert restart.params == {"exclude": ["node2"], "nodes": ["node1", "node3"]} and d.state == "running"


def test_hang_without_spares_restarts_on_the_same_nodes_fast():
    d = decide(interruption(ev.HANG, ["node2"]), History(), TIGHT)
    assert d.actions[-1].kind == RESTART_IN_ALLOCATION and d.actions[-1].params["nodes"] == ["node1", "node2"]


def test_a_failed_node_is_never_reused_requeue_when_no_spare():
    d = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), TIGHT)
    assert d.actions[-1].kind == REQUEUE and d.actions[-1].params["exclude"] == ["node2"]
    spare = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), ALLOC)
    assert spare.actions[-1].kind == RESTART_IN_ALLOCATION and "node2" not in spare.actions[-1].params["nodes"]
    assert DRAIN not in kinds(spare)  # draining needs operator mode


def test_operator_mode_drains_blamed_nodes():
    d = decide(interruption(ev.HARDWARE, ["node3"]), History(), ALLOC, PolicyConfig(operator_mode=True))
    assert DRAIN in kinds(d) and d.actions[kinds(d).index(DRAIN)].target == ("node3",)


def test_ledger_exclusions_apply_on_requeue():
    alloc = Allocation(("node1", "node2"), 2, excluded=frozenset({"node4"}))
    d = decide(interruption(ev.NODE_FAILURE, ["node1"]), History(), alloc)
    assert d.actions[-1].kind == REQUEUE and d.actions[-1].params["exclude"] == ["node1", "node4"]


def test_slurm_requeue_in_progress_is_awaited():
    alloc = Allocation(("node1", "node2"), 2, slurm_requeues=True)
    d = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), alloc)
    assert d.actions[-1].kind == AWAIT_REQUEUE and d.actions[-1].params["exclude"] == ["node2"]


def test_numerical_stops_without_checkpointing_the_bad_state_with_a_clear_message():
    d = decide(interruption(ev.NUMERICAL, evidence=["rank 0 reported loss=nan at step 7"]), History(), ALLOC)
    assert kinds(d) == [ALERT, STOP_STEP, STOP] and d.state == "failed"
    assert d.actions[0].tier == "L3" and d.actions[1].params["checkpoint"] is False
    assert "NaN/Inf" in d.message and "loss=nan" in d.actions[0].reason
    d2 = decide(interruption(ev.NUMERICAL), History(), ALLOC, PolicyConfig(checkpoint_on_numerical=True))
    assert d2.actions[1].params["checkpoint"] is True


def test_app_error_restarts_twice_then_stops():
    history, states = History(), []
    for t in range(3):
        d = decide(interruption(ev.APP_ERROR), history, ALLOC, now=float(t))
        history = history.record(ev.APP_ERROR, float(t))
        states.append((d.state, d.actions[-1].kind))
    assert states == [("running", RESTART_IN_ALLOCATION), ("running", RESTART_IN_ALLOCATION), ("failed", STOP)]


def test_progress_resets_the_budget_but_the_same_checkpoint_again_does_not():
    history = History().record(ev.APP_ERROR, 1).record(ev.APP_ERROR, 2).progress(100)
    assert decide(interruption(ev.APP_ERROR), history, ALLOC).state == "running"
    history = History().progress(100).record(ev.APP_ERROR, 1).record(ev.APP_ERROR, 2).progress(100)
    assert decide(interruption(ev.APP_ERROR), history, ALLOC).state == "failed"


def test_exhausted_budget_can_hold_instead_of_stop():
    history = History().record(ev.HANG, 1).record(ev.HANG, 2).record(ev.HANG, 3)
    d = decide(interruption(ev.HANG, ["node1"]), history, ALLOC, PolicyConfig(on_budget_exhausted="hold"))
    assert d.state == "held" and d.actions[-1].kind == HOLD and d.actions[0].tier == "L4"
    assert "budget" in d.actions[0].reason


def test_crash_loop_across_classes_stops():
    config = PolicyConfig(max_fault_restarts=3, restart_window_s=100)
    history = History()
    for t, cls in enumerate([ev.HANG, ev.COMM_ERROR, ev.UNKNOWN]):
        history = history.record(cls, float(t))
    d = decide(interruption(ev.APP_ERROR), history, ALLOC, config, now=5.0)
    assert d.state == "failed" and "crash loop" in d.message
    assert decide(interruption(ev.APP_ERROR), history, ALLOC, config, now=500.0).state == "running"


def test_completed_finishes_and_cancel_stops():
    assert kinds(decide(interruption(ev.COMPLETED), History(), ALLOC)) == [FINISH]
    d = decide(interruption(ev.CANCELLED), History(), ALLOC)
    assert d.state == "stopped" and kinds(d)[-1] == STOP


def test_backoff_appears_from_the_second_fault_since_progress():
    first = decide(interruption(ev.UNKNOWN), History(), ALLOC)
    assert BACKOFF not in kinds(first)
    second = decide(interruption(ev.COMM_ERROR), History().record(ev.UNKNOWN, 0), ALLOC)
    assert second.actions[kinds(second).index(BACKOFF)].params["seconds"] == 5.0


@given(n=st.integers(0, 10_000), base=st.floats(0, 100), factor=st.floats(1, 10), extra=st.floats(0, 1000))
def test_backoff_is_bounded_and_monotonic(n, base, factor, extra):
    config = PolicyConfig(backoff_base_s=base, backoff_factor=factor, backoff_max_s=base + extra + 1e-9)
    a, b = backoff_seconds(n, config), backoff_seconds(n + 1, config)
    assert 0 <= a <= b <= config.backoff_max_s


_classes = st.sampled_from(ev.INTERRUPTION_CLASSES + (ev.COMPLETED,))


@settings(max_examples=200)
@given(
    seq=st.lists(st.tuples(_classes, st.booleans()), max_size=30),
    budget=st.integers(0, 4),
)
def test_no_class_is_restarted_past_its_budget_and_preemption_never_blames(seq, budget):
    """Replays random campaigns (interruptions, some followed by progress) through decide()."""
    config = PolicyConfig(budgets={ev.APP_ERROR: budget}, max_fault_restarts=1000)
    history, step = History(), 0
    for t, (cls, progressed) in enumerate(seq):
        blamed = ["node1"] if cls in (ev.NODE_FAILURE, ev.HARDWARE, ev.HANG) else []
        d = decide(interruption(cls, blamed), history, ALLOC, config, now=float(t))
        restarts = {RESTART_IN_ALLOCATION, REQUEUE, AWAIT_REQUEUE} & set(kinds(d))
        history = history.record(cls, float(t))
        if cls == ev.APP_ERROR and history.streaks[ev.APP_ERROR] > budget:
            assert not restarts and d.state == "failed"
        if cls == ev.PREEMPTION:
            assert MARK_SUSPECT not in kinds(d) and all(not a.target for a in d.actions)
        if cls in (ev.NUMERICAL, ev.CANCELLED):
            assert not restarts
        if progressed:
            step += 1
            history = history.progress(step)


def test_history_folds_from_journal_events():
    events = [
        ev.interruption_event(1.0, ev.APP_ERROR, [], 0.9, ["x"]),
        ev.checkpoint_committed(2.0, 100, "/ck/100"),
        ev.interruption_event(3.0, ev.APP_ERROR, [], 0.9, ["x"]),
        ev.interruption_event(4.0, ev.PREEMPTION, [], 0.9, ["x"]),
        {"type": "something_new", "t": 5.0},
    ]
    h = History.fold(events)
    assert h.streaks == {ev.APP_ERROR: 1, ev.PREEMPTION: 1} and h.totals[ev.APP_ERROR] == 2
    assert h.faults_since_progress == 1 and h.best_step == 100 and h.fault_times == (1.0, 3.0)


def test_actions_become_journal_events():
    d = decide(interruption(ev.HANG, ["node2"]), History(), ALLOC)
    e = d.actions[0].to_event(7.0)
    assert e["type"] == ev.ACTION and e["tier"] == "L4" and e["target"] == ["node2"] and e["t"] == 7.0


def test_warnings_are_l2_alerts_with_a_suggestion():
    (a,) = respond_to_warning("straggler", ("node3",), "rank 5 is 2x slower")
    assert a.kind == ALERT and a.tier == "L2" and "exclude" in a.params["suggested_action"]


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"budgets": {"app_eror": 2}}, "unknown class 'app_eror'"),
        ({"budgets": {ev.HANG: -1}}, "policy.budgets.hang"),
        ({"tiers": {ev.HANG: "L5"}}, "policy.tiers.hang"),
        ({"backoff_base_s": 10, "backoff_max_s": 5}, "backoff_max_s"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"on_budget_exhausted": "retry"}, "on_budget_exhausted"),
        ({"max_fault_restarts": 0}, "max_fault_restarts"),
        ({"stop_grace_s": float("nan")}, "stop_grace_s"),
    ],
)
def test_bad_config_names_the_key(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        PolicyConfig(**kwargs)


def test_from_mapping_rejects_typos_and_keeps_defaults():
    with pytest.raises(ValueError, match="policy.operator_mod: unknown setting"):
        PolicyConfig.from_mapping({"operator_mod": True})
    config = PolicyConfig.from_mapping({"budgets": {ev.HANG: 1}})
    assert config.budgets[ev.HANG] == 1 and config.budgets[ev.APP_ERROR] == 2


def test_too_many_restarts_in_one_allocation_fall_back_to_requeue():
    alloc = Allocation(("node1", "node2", "node3"), 2, restarts_here=3)
    d = decide(interruption(ev.HANG, ["node2"]), History(), alloc)
    assert d.actions[-1].kind == REQUEUE and "3 restarts" in d.actions[-1].reason


def test_time_limits_without_progress_stop_with_advice():
    history = History().record(ev.TIMEOUT, 1).record(ev.TIMEOUT, 2).record(ev.TIMEOUT, 3)
    d = decide(interruption(ev.TIMEOUT), history, ALLOC)
    assert d.state == "failed" and "checkpoint" in d.message
    assert decide(interruption(ev.TIMEOUT), history.progress(10), ALLOC).state == "pending"
