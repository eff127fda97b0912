"""decisions/recovery_timings.py: each recovery's phases from the journal (the report's ``recovery`` per launch)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.recovery_timings import RECOVERY_EVENTS, recoveries
from supervisor.report_view import fold, render_text


def launched(t: float, n: int, **extra: object) -> dict:
    return {**ev.step_launched(t, n, ["n1", "n2"]), **extra}


def detected(t: float) -> dict:
    return {"type": ev.DETECTION, "t": t, "kind": "rank_exited"}


def interrupted(t: float, cls: str = ev.UNKNOWN) -> dict:
    return ev.interruption_event(t, cls, [], 0.9, [])


def progress(t: float, n: int, step_t: float, **extra: object) -> dict:
    return {**ev.step_progress(t, n, 5, step_t, 2), **extra}


def test_a_relaunch_is_timed_from_its_first_detection_to_the_new_launchs_first_step() -> None:
    rows = recoveries([launched(0, 1), progress(2, 1, 1.5), detected(10), detected(11), interrupted(12),
                       launched(15, 2), progress(21, 2, 20)])  # fmt: skip
    assert rows == [None, {"how": "relaunch", "class": ev.UNKNOWN, "verdict_s": 2.0, "teardown_s": 3.0,
                           "up_s": 5.0, "restore_s": None, "total_s": 10.0}]  # fmt: skip


def test_a_warm_restart_splits_its_teardown_into_the_release_and_the_order() -> None:
    rows = recoveries([launched(0, 1), interrupted(12, ev.APP_ERROR), launched(12.5, 2, generation=1),
                       ev.warm_restart_ordered(13, 2, 1, 0.4, 0.3), progress(15, 2, 14)])  # fmt: skip
    assert rows[1] == {"how": "warm", "class": ev.APP_ERROR, "verdict_s": None, "teardown_s": 1.0,
                       "release_s": 0.4, "order_s": 0.3, "up_s": 1.0, "restore_s": None, "total_s": 2.0}  # fmt: skip


def test_the_state_load_the_ranks_measured_splits_the_start_up_and_only_the_first_step_record_counts() -> None:
    rows = recoveries([launched(0, 1), progress(1, 1, 1, restore_s=9.0), interrupted(12, ev.NODE_FAILURE),
                       launched(15, 2), progress(21, 2, 20, restore_s=1.5), progress(40, 2, 39, restore_s=7.0)])
    assert rows[0] is None  # a campaign's first launch is no recovery, whatever it loaded
    assert rows[1] is not None and rows[1]["up_s"] == 5.0 and rows[1]["restore_s"] == 1.5


def test_a_first_step_before_the_order_was_seen_taken_cuts_the_order_there() -> None:
    """Seen on Slurm: a standby took its rank and the generation stepped before the agents' next report showed the
    standby as its rank (order_s 0.74 s, the first step 0.4 s after the interruption): the order was taken by the
    first step, so the teardown ends there and the figures still add up."""
    rows = recoveries([launched(0, 1), interrupted(10, ev.UNKNOWN), launched(10.2, 2, generation=1),
                       ev.warm_restart_ordered(11.0, 2, 1, 0.05, 0.74), progress(11.2, 2, 10.4)])  # fmt: skip
    r = rows[1]
    assert r is not None and r["teardown_s"] == 0.4 and r["up_s"] == 0.0 and r["total_s"] == 0.4, r
    assert r["order_s"] == 0.14 and r["release_s"] + r["order_s"] <= r["teardown_s"] <= r["total_s"], r


def test_a_requeue_counts_the_queue_in_its_teardown_and_a_fresh_campaigns_first_launch_is_no_recovery() -> None:
    rows = recoveries([{"type": ev.ATTEMPT_STARTED, "t": 0}, launched(1, 1), interrupted(12, ev.PREEMPTION),
                       {"type": ev.ATTEMPT_STARTED, "t": 40}, launched(45, 1), progress(61, 1, 60)])  # fmt: skip
    assert rows[0] is None
    assert rows[1] is not None and rows[1]["how"] == "requeue" and rows[1]["teardown_s"] == 33.0
    assert rows[1]["total_s"] == 48.0


def test_a_warm_restart_given_up_before_its_order_leaves_the_cold_launch_timed_from_the_same_interruption() -> None:
    rows = recoveries([launched(0, 1), detected(11), interrupted(12), launched(12.5, 2, generation=1),
                       launched(20, 3), progress(26, 3, 25)])  # fmt: skip
    warm, cold = rows[1], rows[2]
    assert warm is not None and warm["teardown_s"] is None and warm["up_s"] is None and warm["order_s"] is None
    assert cold == {"how": "relaunch", "class": ev.UNKNOWN, "verdict_s": 1.0, "teardown_s": 8.0, "up_s": 5.0,
                    "restore_s": None, "total_s": 14.0}  # fmt: skip


def test_detections_after_the_verdict_or_before_any_launch_do_not_move_the_next_verdict() -> None:
    rows = recoveries([detected(1), launched(2, 1), interrupted(12), detected(13), launched(15, 2),
                       progress(17, 2, 16)])  # fmt: skip
    assert rows[1] is not None and rows[1]["verdict_s"] is None and rows[1]["total_s"] == 4.0


def test_the_report_carries_each_launchs_recovery_and_says_it_in_a_line() -> None:
    events = [ev.campaign_started(0, "c", ["python", "t.py"]), ev.attempt_started(0, "1", 0, ["n1", "n2"], None),
              launched(1, 1), interrupted(12, ev.APP_ERROR), launched(12.5, 2, generation=1, replaced_ranks=[1]),
              ev.warm_restart_ordered(13, 2, 1, 0.4, 0.1), progress(15, 2, 14, restore_s=0.3)]  # fmt: skip
    report = fold(events, now=20)
    assert "recovery" not in report["attempts"][0]
    assert report["attempts"][1]["recovery"]["how"] == "warm"
    assert ("launch 2: back by warm restart after app_error: verdict -, teardown 1.0 s (release 0.4 s, order 0.1 s), "
            "to the first step 1.0 s (state load 0.30 s), in all 2.0 s") in render_text(report)  # fmt: skip


_value = st.none() | st.booleans() | st.text(max_size=3) | st.floats(allow_nan=True) | st.integers(-5, 10**15)
_event = st.fixed_dictionaries({"type": st.sampled_from(sorted(RECOVERY_EVENTS))},
                               optional={"t": _value, "generation": _value, "class": _value, "step_t": _value,
                                         "release_s": _value, "order_s": _value, "launch": _value,
                                         "restore_s": _value})  # fmt: skip


@given(st.lists(_event, max_size=30))
def test_any_journal_gives_one_entry_per_launch_and_only_non_negative_figures(events: list[dict]) -> None:
    rows = recoveries(events)
    assert len(rows) == sum(1 for e in events if e["type"] == ev.STEP_LAUNCHED and isinstance(e.get("t"), (int, float))
                            and not isinstance(e.get("t"), bool) and e["t"] == e["t"] and abs(e["t"]) < 1e12)  # fmt: skip
    for row in rows:
        for key, value in (row or {}).items():
            if key.endswith("_s") and value is not None:
                assert value >= 0, (key, value, row)
