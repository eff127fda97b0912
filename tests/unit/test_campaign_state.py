"""The one fold of the journal: every reader's view (policy History, node Ledger, report, the loop's facts) comes
from one pass and agrees with folding that view alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import campaign_state
from supervisor.decisions import events as ev
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.policy import History

NODES = ["n1", "n2", "n3"]

_event = st.one_of(
    st.builds(lambda t, c, b: ev.interruption_event(t, c, b, 0.9, ["x"]),
              st.floats(0, 1e5), st.sampled_from(ev.OUTCOMES), st.lists(st.sampled_from(NODES), max_size=2)),
    st.builds(lambda t, s: ev.checkpoint_committed(t, s, f"/ck/{s}"), st.floats(0, 1e5), st.integers(0, 500)),
    st.builds(lambda t, n: ev.node_forgiven(t, n), st.floats(0, 1e5), st.sampled_from(NODES)),
    st.builds(lambda t, n: ev.attempt_started(t, "7", 0, n, None), st.floats(0, 1e5), st.lists(st.sampled_from(NODES))),
    st.builds(lambda t, c: ev.attempt_ended(t, "7", c), st.floats(0, 1e5), st.sampled_from(ev.OUTCOMES)),
    st.builds(lambda t, p: ev.checkpoint_quarantined(t, p, "torn"), st.floats(0, 1e5), st.sampled_from(["/a", "/b"])),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=30))
def test_the_views_of_the_one_fold_equal_each_views_own_fold(events: list[dict]) -> None:
    state = campaign_state.fold(events)
    assert state.history == History.fold(events)
    assert state.ledger.table(1e6) == Ledger.fold(events).table(1e6)
    committed = [e["step"] for e in events if e["type"] == ev.CHECKPOINT_COMMITTED]
    assert state.best_step == (max(committed) if committed else None)
    assert state.quarantined == {e["path"] for e in events if e["type"] == ev.CHECKPOINT_QUARANTINED}


def test_the_loop_facts_restore_what_earlier_runs_learned() -> None:
    events = [
        ev.campaign_started(1.0, "/c", ["python"], "7"),
        ev.timeouts_learned(2.0, {"step": {"n": 1}}, {"step": 5.0}),
        ev.timeouts_learned(3.0, {"step": {"n": 2}}, {"step": 6.0}),
        ev.attempt_started(4.0, "7", 0, ["n1"], None),
        {"type": ev.DETECTION, "t": 5.0, "kind": "node_silent", "nodes": ["n1"]},
    ]
    state = campaign_state.fold(events)
    assert state.started and state.timeouts == {"step": {"n": 2}}  # the last one wins
    assert state.open_attempt is not None and state.silent_nodes == {"n1"} and state.last_seen == 5.0
    closed = campaign_state.fold([*events, ev.attempt_ended(6.0, "7", ev.UNKNOWN)])
    assert closed.open_attempt is None
    assert campaign_state.infer_previous_outcome(closed, ["n1"]) == []


def test_an_attempt_without_an_end_is_inferred_from_silent_agents_when_slurm_says_nothing() -> None:
    state = campaign_state.fold([
        ev.attempt_started(4.0, "7", 0, ["n1", "n2"], None),
        {"type": ev.DETECTION, "t": 5.0, "kind": "node_silent", "nodes": ["n2"]},
    ])  # fmt: skip
    interruption, ended = campaign_state.infer_previous_outcome(state, [])
    assert interruption["class"] == ev.NODE_FAILURE and interruption["blamed_nodes"] == ["n2"]
    assert interruption["confidence"] == 0.6 and ended["outcome"]["class"] == ev.NODE_FAILURE


def test_a_supervisor_death_noted_by_the_batch_script_is_unknown_and_blames_nobody():
    """The batch script requeued the job after its supervisor died of SIGKILL: nobody's node is at fault, even
    when the previous run had silent nodes or Slurm now reports one down."""
    from supervisor.batchwrap import death_note

    log = ("{\"event\": \"step_launched\"}\n"
           "supervise: the supervisor died of signal 9 in job 77 run 0 with nothing ending the job: requeued the "
           "job; its next run continues the campaign from the journal\n")  # fmt: skip
    note = death_note(log, "77", 0)
    assert note is not None and note.startswith("supervise: the supervisor died of signal 9")
    assert death_note(log, "77", 1) is None and death_note(log, "7", 0) is None
    events = [
        ev.campaign_started(0.0, "/c", ["python"], "77"),
        ev.attempt_started(1.0, "77", 0, ["n1", "n2"], None),
        {"type": ev.DETECTION, "t": 2.0, "kind": "node_silent", "nodes": ["n2"]},
    ]
    interruption, ended = campaign_state.infer_previous_outcome(campaign_state.fold(events), ["n1"], None, note)
    assert interruption["class"] == ended["outcome"]["class"] == ev.UNKNOWN
    assert interruption["blamed_nodes"] == [] and "died of signal 9" in interruption["evidence"][0]
