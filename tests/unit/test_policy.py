"""Policy: the response table per class, budgets that stop bug loops, bounded backoff, config validation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Interruption
from supervisor.decisions.detect import GLOBAL_STALL, LOSS_SPIKE, STRAGGLER, DetectionEvent
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.policy import (
    ALERT,
    AWAIT_REQUEUE,
    BACKOFF,
    CHECKPOINT_NOW,
    DRAIN,
    DUMP_STACKS,
    FINISH,
    FLUSH_MEMORY,
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


def test_preemption_or_time_limit_after_the_ranks_ended_flushes_node_memory_instead_of_asking_them():
    """Slurm's SIGTERM reached the ranks before the supervisor knew (preemption without a user signal): nobody
    is left to save, the agents copy the newest memory snapshot to the filesystem."""
    ended = replace(ALLOC, step_running=False)
    assert kinds(decide(interruption(ev.PREEMPTION), History(), ended)) == [ALERT, FLUSH_MEMORY, AWAIT_REQUEUE]
    assert kinds(decide(interruption(ev.TIMEOUT), History(), ended)) == [ALERT, FLUSH_MEMORY, REQUEUE]


def test_a_fault_that_makes_the_job_let_go_of_its_nodes_flushes_node_memory_first_but_never_after_a_nan():
    """A requeue (no spare left), a stop for a person: the next job resumes from the newest memory snapshot the
    agents copy to the filesystem, the lost node's shards from its buddy (the lost node is not asked)."""
    lost = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), replace(TIGHT, step_running=False))
    assert kinds(lost)[-2:] == [FLUSH_MEMORY, REQUEUE]
    assert lost.actions[-2].params["exclude"] == ["node2"]
    hard = decide(interruption(ev.HARDWARE, ["node1"]), History(), TIGHT)
    assert kinds(hard)[-2:] == [FLUSH_MEMORY, REQUEUE] and hard.actions[-2].params["exclude"] == ["node1"]
    looping = History(streaks={ev.APP_ERROR: 3}, faults_since_progress=3)
    stop = decide(interruption(ev.APP_ERROR), looping, replace(ALLOC, step_running=False))
    assert kinds(stop)[-2:] == [FLUSH_MEMORY, STOP]
    nan = decide(interruption(ev.NUMERICAL), History(streaks={ev.NUMERICAL: 5}, faults_since_progress=5), TIGHT)
    assert STOP in kinds(nan) and FLUSH_MEMORY not in kinds(nan)
    hung = decide(interruption(ev.HANG), History(streaks={ev.HANG: 9}, faults_since_progress=9), ALLOC)
    assert kinds(hung)[-3:] == [KILL_STEP, FLUSH_MEMORY, STOP]  # the hung step ends before the copy
    # a save-and-stop flushes beside the ranks' save already; a relaunch here keeps node memory
    saving = decide(interruption(ev.APP_ERROR), looping, ALLOC)
    assert STOP_STEP in kinds(saving) and FLUSH_MEMORY not in kinds(saving)
    assert FLUSH_MEMORY not in kinds(decide(interruption(ev.HARDWARE, ["node1"]), History(), ALLOC))


def test_timeout_checkpoints_then_requeues():
    d = decide(interruption(ev.TIMEOUT), History(), ALLOC)
    assert kinds(d) == [ALERT, CHECKPOINT_NOW, REQUEUE]
    assert d.actions[-1].params["after_checkpoint"] is True


def test_hang_is_l4_then_restart_in_allocation_excluding_the_node_when_a_spare_exists():
    d = decide(interruption(ev.HANG, ["node2"]), History(), ALLOC)
    assert kinds(d) == [ALERT, DUMP_STACKS, KILL_STEP, RESTART_IN_ALLOCATION]  # the interruption event strikes
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
    blamed = replace(interruption(ev.HARDWARE, ["node3"]), witnesses=("agent", "program"))
    d = decide(blamed, History(), ALLOC, PolicyConfig(operator_mode=True))
    assert DRAIN in kinds(d) and d.actions[kinds(d).index(DRAIN)].target == ("node3",)


@pytest.mark.parametrize("witnesses", [("program",), ()])
def test_a_node_is_never_drained_on_the_programs_word_alone(witnesses):
    """A rank's printed Xid excludes its node from this campaign (the node is not reused), but draining takes it
    from every user of the site: that needs Slurm's or a node agent's word."""
    blamed = replace(interruption(ev.HARDWARE, ["node3"]), witnesses=witnesses)
    d = decide(blamed, History(), ALLOC, PolicyConfig(operator_mode=True))
    assert DRAIN not in kinds(d)
    assert "node3" in d.actions[-1].params["exclude"]


def test_ledger_exclusions_apply_on_requeue():
    alloc = Allocation(("node1", "node2"), 2, excluded=frozenset({"node4"}))
    d = decide(interruption(ev.NODE_FAILURE, ["node1"]), History(), alloc)
    assert d.actions[-1].kind == REQUEUE and d.actions[-1].params["exclude"] == ["node1", "node4"]


def test_slurm_requeue_in_progress_is_awaited():
    alloc = Allocation(("node1", "node2"), 2, slurm_requeues=True)
    d = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), alloc)
    assert d.actions[-1].kind == AWAIT_REQUEUE and d.actions[-1].params["exclude"] == ["node2"]


def test_numerical_rolls_back_twice_then_stops_never_checkpointing_the_bad_state():
    """A diverged loss: the step is stopped without a checkpoint of the NaN state and relaunched as a roll back
    (from before the divergence, its batches skipped); a third NaN without progress stops with a clear message."""
    nan = interruption(ev.NUMERICAL, evidence=["rank 0 reported loss=nan at step 7"])
    history = History()
    for t in range(2):
        d = decide(nan, history, ALLOC, now=float(t))
        assert kinds(d)[:2] == [ALERT, STOP_STEP] and d.actions[1].params["checkpoint"] is False
        assert d.actions[-1].kind == RESTART_IN_ALLOCATION and d.actions[-1].params["rollback"] is True
        assert "roll back" in d.message and d.state == "running"
        history = history.record(ev.NUMERICAL, float(t))
    d = decide(nan, history, ALLOC, now=2.0)
    assert kinds(d) == [ALERT, STOP_STEP, STOP] and d.state == "failed"
    assert d.actions[0].tier == "L3" and d.actions[1].params["checkpoint"] is False
    assert "NaN/Inf" in d.message and "loss=nan" in d.actions[0].reason
    d2 = decide(interruption(ev.NUMERICAL), History(), ALLOC, PolicyConfig(checkpoint_on_numerical=True))
    assert d2.actions[1].params["checkpoint"] is True
    stop_at_once = PolicyConfig(budgets={ev.NUMERICAL: 0})  # as before roll backs: a person decides
    assert kinds(decide(nan, History(), ALLOC, stop_at_once)) == [ALERT, STOP_STEP, STOP]
    assert not [a for a in decide(interruption(ev.APP_ERROR), History(), ALLOC).actions if a.params.get("rollback")]


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
        if cls == ev.CANCELLED:
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


def test_a_newer_memory_snapshot_resumed_from_is_progress_but_the_same_one_again_is_not():
    """Hardware faults on different nodes minutes apart, each relaunch resuming from a newer memory snapshot, are
    not a loop (the tier kept the work); a program failing at the same step resumes from the same snapshot each
    time, and its budget still ends the loop."""
    hardware = [ev.interruption_event(float(t), ev.HARDWARE, [f"node{t}"], 0.9, ["Xid 79"]) for t in range(1, 6)]
    moving = [e for i, h in enumerate(hardware) for e in (h, ev.memory_pick(h["t"] + 0.5, i + 2, 100 + 10 * i, "x"))]
    h = History.fold([ev.checkpoint_committed(0.5, 50, "/ck/50"), *moving])
    assert h.faults_since_progress == 0 and h.best_step == 140 and h.totals[ev.HARDWARE] == 5
    stuck = [e for i, h in enumerate(hardware) for e in (h, ev.memory_pick(h["t"] + 0.5, i + 2, 100, "x"))]
    h = History.fold(stuck)
    assert h.faults_since_progress == 4 and h.best_step == 100
    d = decide(interruption(ev.HARDWARE, ["node7"]), h, ALLOC)
    assert STOP in kinds(d) and "without progress" in d.message
    # a pick that found nothing (None: the filesystem tier) and a failed flush are no restore points
    h = History.fold([*hardware[:2], ev.memory_pick(3.0, 3, None, "nothing"), ev.memory_flush(3.5, None, "late")])
    assert h.faults_since_progress == 2 and h.best_step is None
    assert History.fold([ev.memory_flush(1.0, 70, "flushed", "/c/f", 2, 0.1)]).best_step == 70


def test_actions_become_journal_events():
    d = decide(interruption(ev.HANG, ["node2"]), History(), ALLOC)
    e = d.actions[0].to_event(7.0)
    assert e["type"] == ev.ACTION and e["tier"] == "L4" and e["target"] == ["node2"] and e["t"] == 7.0


STRAGGLER_SEEN = DetectionEvent(STRAGGLER, (5,), ("node3",), evidence=("rank 5 on node3: 2x slower",))
SPIKE_SEEN = DetectionEvent(LOSS_SPIKE, (0,), ("node1",), evidence=("loss 9.0 is 8 std above the mean",))


@pytest.mark.parametrize(
    "warning,strike_on,expected",
    [
        (STRAGGLER_SEEN, (STRAGGLER,), [(ALERT, ("node3",)), (MARK_SUSPECT, ("node3",))]),  # the default
        (SPIKE_SEEN, (STRAGGLER,), [(ALERT, ("node1",))]),  # a loss spike says nothing about rank 0's node
        (SPIKE_SEEN, (STRAGGLER, LOSS_SPIKE), [(ALERT, ("node1",)), (MARK_SUSPECT, ("node1",))]),
        (STRAGGLER_SEEN, (), [(ALERT, ("node3",))]),  # strikes turned off
        (DetectionEvent(STRAGGLER, (5,), ()), (STRAGGLER,), [(ALERT, ())]),  # no node known: nobody struck
        (DetectionEvent(GLOBAL_STALL, (0, 1), ("node1",)), (STRAGGLER,), []),  # a fault is not a warning
    ],
)
def test_warnings_raise_an_l2_alert_and_strike_per_policy(warning, strike_on, expected):
    actions = respond_to_warning(warning, PolicyConfig(strike_on_warnings=strike_on))
    assert [(a.kind, a.target) for a in actions] == expected
    assert all(a.tier == "L2" for a in actions)
    for a in actions:
        assert a.params.get("warning", a.params.get("strike")) == warning.kind
    if actions:
        assert warning.evidence[0] in actions[0].reason if warning.evidence else True
        assert "suggested_action" in actions[0].params


def test_a_mark_suspect_strikes_through_the_journal():
    (_, mark) = respond_to_warning(STRAGGLER_SEEN)
    event = mark.to_event(10.0)
    assert event == {"type": ev.ACTION, "t": 10.0, "kind": MARK_SUSPECT, "tier": "L2", "target": ["node3"],
                     "reason": mark.reason, "params": {"strike": STRAGGLER, "ranks": [5]}}  # fmt: skip
    ledger = Ledger.fold([event, {**event, "t": 20.0}, {**event, "t": 30.0}, {**event, "t": 40.0}])
    assert ledger.score("node3", 40.0) == pytest.approx(4 * 0.25, rel=0.01) and ledger.nodes["node3"].strikes == 4
    assert ledger.table(40.0)[0]["last_reason"] == STRAGGLER


def test_strike_on_warnings_is_validated():
    with pytest.raises(ValueError, match="policy.strike_on_warnings"):
        PolicyConfig(strike_on_warnings=("stragler",))
    with pytest.raises(ValueError, match="policy.strike_on_warnings"):
        PolicyConfig(strike_on_warnings="straggler")  # type: ignore[arg-type]
    assert PolicyConfig.from_mapping({"strike_on_warnings": []}).strike_on_warnings == ()


@settings(max_examples=300)
@given(
    seq=st.lists(_classes, max_size=12),
    budget=st.one_of(st.none(), st.integers(0, 4)),
    hold=st.booleans(),
    running=st.booleans(),
    requeues=st.booleans(),
)
def test_a_cancel_is_final_whatever_came_before(seq, budget, hold, running, requeues):
    """scancel is the user's right: never requeued, relaunched or held, whatever the budgets and history."""
    config = PolicyConfig(budgets={ev.CANCELLED: budget}, on_budget_exhausted="hold" if hold else "stop")
    history = History()
    for t, cls in enumerate(seq):
        history = history.record(cls, float(t))
    alloc = Allocation(("node1", "node2", "node3"), 2, step_running=running, slurm_requeues=requeues)
    d = decide(interruption(ev.CANCELLED, ["node2"]), history, alloc, config, now=100.0)
    assert d.state == "stopped"
    assert not {RESTART_IN_ALLOCATION, REQUEUE, AWAIT_REQUEUE, HOLD, BACKOFF} & set(kinds(d))
    assert d.actions[-1].kind == STOP


@pytest.mark.parametrize(
    "history,blamed,alloc,last,exclude",
    [
        # the app error repeated on node2 alone: node2 stays out, on the spare in this allocation ...
        ((("node2",),), ("node2",), ALLOC, RESTART_IN_ALLOCATION, ["node2"]),
        # ... or, without a spare, by a requeue without it
        ((("node2",),), ("node2",), TIGHT, REQUEUE, ["node2"]),
        # no node blamed: the same nodes again
        ((), (), TIGHT, RESTART_IN_ALLOCATION, []),
    ],
)
def test_an_app_error_that_keeps_to_one_node_leaves_it_out(history, blamed, alloc, last, exclude):
    h = History(app_error_origins=history, streaks={ev.APP_ERROR: len(history)})
    d = decide(interruption(ev.APP_ERROR, blamed), h, alloc)
    assert d.actions[-1].kind == last and d.actions[-1].params["exclude"] == exclude


def test_history_folds_app_error_origins():
    events = [
        {**ev.interruption_event(1.0, ev.APP_ERROR, [], 0.9, ["x"]), "origin_nodes": ["node2"]},
        ev.interruption_event(2.0, ev.APP_ERROR, [], 0.9, ["x"]),  # written before origin_nodes existed
        {**ev.interruption_event(3.0, ev.HANG, [], 0.9, ["x"]), "origin_nodes": ["node1"]},
        ev.checkpoint_committed(4.0, 100, "/ck/100"),  # progress does not forget where crashes happened
        {**ev.interruption_event(5.0, ev.APP_ERROR, ["node2"], 0.9, ["x"]), "origin_nodes": ["node2"]},
    ]
    assert History.fold(events).app_error_origins == (("node2",), (), ("node2",))


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


def test_too_many_restarts_in_one_allocation_without_progress_fall_back_to_requeue():
    alloc = Allocation(("node1", "node2", "node3"), 2, restarts_here=3)
    stuck = History().record(ev.APP_ERROR, 1).record(ev.COMM_ERROR, 2).record(ev.UNKNOWN, 3)
    d = decide(interruption(ev.HANG, ["node2"]), stuck, alloc)
    assert d.actions[-1].kind == REQUEUE and "3 restarts" in d.actions[-1].reason
    # relaunches that each made progress (a new checkpoint) keep the allocation, however many over weeks
    d = decide(interruption(ev.HANG, ["node2"]), stuck.progress(100), alloc)
    assert d.actions[-1].kind == RESTART_IN_ALLOCATION
    assert decide(interruption(ev.HANG, ["node2"]), History(), Allocation(("node1", "node2", "node3"), 2,
                                                                          restarts_here=50)).state == "running"


def test_ledger_excluded_nodes_are_never_relaunched_on_a_requeue_gets_healthy_ones():
    """Spares used up: the ledger's excluded node (a broken GPU struck earlier) is not taken back; the job is
    requeued without it. Only this interruption's soft suspect (a hang's node) may be reused."""
    alloc = Allocation(("node1", "node2", "node3"), 2, excluded=frozenset({"node3"}))
    d = decide(interruption(ev.NODE_FAILURE, ["node2"]), History(), alloc)
    assert d.actions[-1].kind == REQUEUE and d.actions[-1].params["exclude"] == ["node2", "node3"]
    d = decide(interruption(ev.HANG, ["node2"]), History(), alloc)  # the hang's node2 comes back, node3 not
    assert d.actions[-1].kind == RESTART_IN_ALLOCATION and d.actions[-1].params["nodes"] == ["node1", "node2"]
    d = decide(interruption(ev.HANG, ["node2"]), History(), Allocation(("node1", "node2", "node3"), 2))
    assert d.actions[-1].kind == RESTART_IN_ALLOCATION and d.actions[-1].params["nodes"] == ["node1", "node3"]
    d = decide(interruption(ev.HANG, ["node2"]), History(), Allocation(("node1", "node2"), 2))
    assert d.actions[-1].kind == RESTART_IN_ALLOCATION  # no spare: the hang's node is reused (a soft suspect)


def test_time_limits_without_progress_stop_with_advice():
    history = History().record(ev.TIMEOUT, 1).record(ev.TIMEOUT, 2).record(ev.TIMEOUT, 3)
    d = decide(interruption(ev.TIMEOUT), history, ALLOC)
    assert d.state == "failed" and "checkpoint" in d.message
    assert decide(interruption(ev.TIMEOUT), history.progress(10), ALLOC).state == "pending"


@given(nodes=st.lists(st.sampled_from([f"n{i}" for i in range(8)]), max_size=12),
       drop=st.sets(st.sampled_from([f"n{i}" for i in range(8)])))  # fmt: skip
def test_without_keeps_order_and_drops_every_copy(nodes, drop):
    """decide's fast removal (a few nodes removed from a copy) equals the plain filter, duplicates included."""
    from supervisor.decisions.policy import _without

    dropped = drop.intersection(nodes)
    assert _without(tuple(nodes), dropped) == [n for n in nodes if n not in dropped]
