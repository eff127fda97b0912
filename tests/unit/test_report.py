"""The report is a pure fold of the journal: attempts, outcomes, exclusions, checkpoints and time accounting."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.campaign_state import fold as fold_state
from supervisor.decisions.silent_end import infer_previous_outcome
from supervisor.report_view import fold, render_text


def campaign(t0: float = 1000.0) -> list[dict]:
    """A campaign: launch, hang at 60 s, relaunch in allocation, node failure, requeue, completion."""
    return [
        ev.campaign_started(t0, "/c", ["python", "train.py"], "7"),
        ev.attempt_started(t0, "7", 0, ["n1", "n2"], None),
        {**ev.step_launched(t0 + 10, 1, ["n1", "n2"]), "resume_step": None},
        ev.checkpoint_committed(t0 + 40, 30, "/ck/step_30"),
        {"type": "detection", "t": t0 + 60, "kind": "rank_hang", "duration_s": 6.0, "nodes": ["n2"]},
        {**ev.interruption_event(t0 + 60, "hang", ["n2"], 0.9, ["rank 1 silent 6 s"]), "last_step": 45},
        {**ev.step_launched(t0 + 64, 2, ["n1", "n2"], resume_from="/ck/step_30"), "resume_step": 30},
        {**ev.interruption_event(t0 + 100, "node_failure", ["n2"], 0.9, ["n2 DOWN"]), "last_step": 60},
        ev.attempt_ended(t0 + 100, "7", "node_failure", ["n2"], ["n2 DOWN"]),
        {"type": "nodes_excluded", "t": t0 + 101, "nodes": ["n2"]},
        ev.attempt_started(t0 + 130, "7", 1, ["n1", "n3"], None),
        {**ev.step_launched(t0 + 132, 1, ["n1", "n3"], resume_from="/ck/step_60"), "resume_step": 60},
        ev.checkpoint_committed(t0 + 150, 100, "/ck/step_100"),
        {**ev.interruption_event(t0 + 160, "completed", [], 0.95, ["every rank exited 0"]), "last_step": 100},
        ev.attempt_ended(t0 + 160, "7", "completed"),
        ev.campaign_ended(t0 + 160, "completed", "training completed"),
    ]


def test_attempts_outcomes_and_exclusions():
    report = fold(campaign(), now=5000.0)
    assert report["state"] == "completed"
    assert [a["outcome"]["class"] for a in report["attempts"]] == ["hang", "node_failure", "completed"]
    assert [(a["job_id"], a["restart"], a["launch"]) for a in report["attempts"]] == [("7", 0, 1), ("7", 0, 2),
                                                                                      ("7", 1, 1)]
    assert report["attempts"][1]["outcome"]["blamed_nodes"] == ["n2"]
    assert report["excluded_nodes"] == ["n2"]
    assert report["checkpoints"]["latest_valid"] == {"step": 100, "path": "/ck/step_100"}


def test_goodput_accounts_every_second():
    """A journal without per-rank records (written before they existed): steps are spread evenly."""
    g = fold(campaign(), now=5000.0)["goodput"]
    assert g["wall_s"] == 160.0
    bad = g["badput_s"]
    assert bad["queue"] == 30.0  # attempt_ended -> next attempt_started
    assert bad["restart"] == 10.0 + 2.0  # a Slurm run's start to its first launch
    assert {k: v for k, v in g["before_first_launch_s"].items() if v} == {"restart": 10.0}
    assert bad["teardown"] == 4.0  # the hang's decision to the relaunch
    assert bad["detection"] == 6.0
    # launch 1 stepped from 10 s to 54 s (60 minus the 6 s hang detection) up to step 45 and was resumed from
    # step 30: steps 30..45 (44 * 15/45 s) are lost; launch 2 was resumed from where it ended: nothing lost.
    assert bad["lost_work"] == round(44 * 15 / 45, 3)
    assert g["productive_s"] + sum(bad.values()) == g["wall_s"]
    assert 0 < g["ettr"] < 1
    hang = g["by_class"]["hang"]
    assert (hang["interruptions"], hang["total_s"]) == (1, 24.667)
    assert {k: v for k, v in hang["badput_s"].items() if v} == {"lost_work": 14.667, "detection": 6.0, "teardown": 4.0}
    assert {k: v for k, v in g["by_class"]["node_failure"]["badput_s"].items() if v} == {"queue": 30.0, "restart": 2.0}


def test_running_campaign_is_accounted_up_to_now():
    events = campaign()[:7]
    report = fold(events, now=1100.0)
    assert report["state"] == "running"
    assert report["attempts"][-1]["outcome"] is None
    assert report["goodput"]["wall_s"] == 100.0
    assert "running" in render_text(report)


@given(st.lists(st.floats(min_value=0.0, max_value=50.0), min_size=1, max_size=8))
def test_time_is_never_created_or_lost(gaps):
    t = 0.0
    events = [ev.campaign_started(t, "/c", ["x"]), ev.attempt_started(t, "1", 0, ["n1"], None)]
    for i, gap in enumerate(gaps):
        t += gap
        events.append({**ev.step_launched(t, i + 1, ["n1"]), "resume_step": None})
        t += gap
        events.append(ev.interruption_event(t, "app_error", [], 0.8, ["boom"]))
    g = fold(events, now=t + 1)["goodput"]
    assert round(g["productive_s"] + sum(g["badput_s"].values()), 3) == g["wall_s"]  # to the millisecond
    assert all(v >= 0 for v in g["badput_s"].values())


def test_a_run_that_died_with_its_batch_host_is_inferred_a_node_failure():
    history = campaign()[:7]
    inferred = infer_previous_outcome(fold_state(history), ["n2"])
    assert [e["type"] for e in inferred] == ["interruption", "attempt_ended"]
    assert inferred[0]["class"] == "node_failure" and inferred[0]["blamed_nodes"] == ["n2"]
    assert inferred[0]["t"] == history[-1]["t"]  # stamped when the run was last heard of
    assert infer_previous_outcome(fold_state(campaign()), ["n2"]) == []  # that campaign ended properly
    unknown = infer_previous_outcome(fold_state(history), [])
    assert unknown[0]["class"] == "unknown" and unknown[0]["blamed_nodes"] == []


def test_a_completing_job_whose_end_moved_earlier_is_a_cancel():
    from types import SimpleNamespace

    from supervisor.decisions.respond import job_state_of

    completing = SimpleNamespace(base_state=None, state="COMPLETING", end_time=1000, preempt_time=None)
    assert job_state_of(completing, scheduled_end=4600) == "CANCELLED"  # scancel moved EndTime to now
    assert job_state_of(completing, scheduled_end=1000) == "COMPLETING"  # the time limit itself
    preempted = SimpleNamespace(base_state=None, state="COMPLETING", end_time=1000, preempt_time=990)
    assert job_state_of(preempted, scheduled_end=4600) == "COMPLETING"
    running = SimpleNamespace(base_state="RUNNING", state="RUNNING", end_time=4600, preempt_time=None)
    assert job_state_of(running, scheduled_end=4600) == "RUNNING"


def test_torchruns_own_restarts_are_counted_per_launch_and_in_total():
    events = campaign()
    events[5] = {**events[5], "torchrun_restarts": {"n2": 2}}  # the hang's launch: torchrun restarted twice first
    events[13] = {**events[13], "torchrun_restarts": {"n1": 1, "n3": 1}}
    report = fold(events, now=5000.0)
    assert [a.get("torchrun_restarts") for a in report["attempts"]] == [{"n2": 2}, None, {"n1": 1, "n3": 1}]
    assert report["torchrun_restarts"] == 4
    text = render_text(report)
    assert "launch 1: torchrun restarted its workers 2 time(s) (n2 x2)" in text
    assert "launch 3: torchrun restarted its workers 2 time(s) (n1 x1, n3 x1)" in text
    assert fold(campaign(), now=5000.0)["torchrun_restarts"] == 0
