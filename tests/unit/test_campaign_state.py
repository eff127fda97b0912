"""The one fold of the journal: every reader's view (policy History, node Ledger, report, the loop's facts) comes
from one pass and agrees with folding that view alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.policy import History

fold = campaign_state.fold

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
    assert silent_end.infer_previous_outcome(closed, ["n1"]) == []


def test_an_attempt_without_an_end_is_inferred_from_silent_agents_when_slurm_says_nothing() -> None:
    state = campaign_state.fold([
        ev.attempt_started(4.0, "7", 0, ["n1", "n2"], None),
        {"type": ev.DETECTION, "t": 5.0, "kind": "node_silent", "nodes": ["n2"]},
    ])  # fmt: skip
    interruption, ended = silent_end.infer_previous_outcome(state, [])
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
    interruption, ended = silent_end.infer_previous_outcome(campaign_state.fold(events), ["n1"], None, note)
    assert interruption["class"] == ended["outcome"]["class"] == ev.UNKNOWN
    assert interruption["blamed_nodes"] == [] and "died of signal 9" in interruption["evidence"][0]


# ------------------------------------------------------------------------------------------- type-confused events
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(10**400), 10**400), st.floats(allow_nan=True),
                    st.text(max_size=5), st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=3),
                    st.dictionaries(st.sampled_from(["class", "blamed_nodes", "evidence"]),
                                    st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers())),
                                    max_size=3))  # fmt: skip
_FIELDS = ["t", "step", "nodes", "class", "blamed_nodes", "evidence", "job_id", "launch", "outcome", "kind", "path",
           "reason", "histograms", "restart", "resume_step", "last_step", "node", "rank", "result", "detail", "state",
           "excluded", "torchrun_restarts", "stall_s", "duration_s", "origin_nodes", "origin_ranks", "params",
           "interval_s", "mode", "delta_s", "resume_from"]  # fmt: skip
_TYPES = sorted(ev.EVENT_TYPES)
_ODD = st.builds(lambda kind, fields: {"type": kind, **fields}, st.sampled_from(_TYPES),
                 st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=8))  # fmt: skip


@settings(max_examples=400, deadline=None, derandomize=True)
@given(odd=st.lists(_ODD, min_size=1, max_size=5), at=st.integers(0, 5))
def test_a_type_confused_event_never_breaks_the_fold_nor_anything_that_reads_it(odd: list, at: int) -> None:
    """Issue 22, low: one type-confused event made every restart die at start (the loop folds the journal)."""
    from supervisor.plot.timeline import TimelineView
    from supervisor.report_view import render_text

    good = [ev.campaign_started(1.0, "/c", ["x"], "7"), ev.attempt_started(2.0, "7", 0, ["n1"], None),
            ev.step_launched(3.0, 1, ["n1"]), ev.checkpoint_committed(4.0, 10, "/p"),
            ev.interruption_event(5.0, "hang", ["n1"], 0.9, ["x"])]  # fmt: skip
    events = good[:at] + odd + good[at:]
    view = TimelineView()
    state = fold(events, views=(view,))
    doc = state.report(10.0)
    render_text(doc)
    view.timeline(10.0, doc["goodput"])
    state.interval.measured(10.0)
    state.ledger.table(10.0)
    # the good events still tell their story (an odd event readable as a launch, e.g. a step_launched without its
    # number, may add a row of its own before it)
    assert [a for a in doc["attempts"] if a["launch"] == 1 and a["start"] == 3.0 and a["job_id"] == "7"]


def test_an_odd_event_is_skipped_and_said() -> None:
    events = [ev.campaign_started(1.0, "/c", ["x"], "7"), {"type": ev.STEP_LAUNCHED, "t": "yesterday"},
              {"type": ev.NODES_EXCLUDED, "t": 2.0, "nodes": [1, "n2", None]}]  # fmt: skip
    state = fold(events)
    assert state.unreadable == 1 and state.report(3.0)["unreadable_events"] == 1
    assert state.report(3.0)["excluded_nodes"] == ["n2"]  # what was readable of it is kept
