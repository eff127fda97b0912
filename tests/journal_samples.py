"""A hand-written campaign journal the picture tests draw (tests/unit/test_plot.py, and in a real browser
tests/integration/test_pages_in_chromium.py)."""

from __future__ import annotations

from supervisor.decisions import events as ev

T0 = 1_796_234_937.0  # 2026-12-02


def journal(t0: float = T0) -> list[dict]:
    """Launch on n1+n2, checkpoint, hang blamed on n2, relaunch, node failure of n2, requeue onto n1+n3, done."""
    return [
        ev.campaign_started(t0, "/c", ["python", "train.py"], "7"),
        ev.attempt_started(t0, "7", 0, ["n1", "n2"], None),
        {**ev.step_launched(t0 + 10, 1, ["n1", "n2"]), "resume_step": None},
        ev.checkpoint_committed(t0 + 40, 30, "/ck/step_30"),
        {"type": "detection", "t": t0 + 60, "kind": "rank_hang", "duration_s": 6.0, "nodes": ["n2"]},
        {**ev.interruption_event(t0 + 60, "hang", ["n2"], 0.9, ["rank 1 silent 6 s"]), "last_step": 45},
        {**ev.step_launched(t0 + 64, 2, ["n1", "n2"], resume_from="/ck/step_30"), "resume_step": 30},
        ev.checkpoint_committed(t0 + 90, 55, "/ck/step_55"),
        {**ev.interruption_event(t0 + 100, "node_failure", ["n2"], 0.9, ["n2 DOWN"]), "last_step": 60},
        ev.attempt_ended(t0 + 100, "7", "node_failure", ["n2"], ["n2 DOWN"]),
        ev.attempt_started(t0 + 130, "7", 1, ["n1", "n3"], None),
        {**ev.step_launched(t0 + 132, 1, ["n1", "n3"], resume_from="/ck/step_55"), "resume_step": 55},
        ev.checkpoint_committed(t0 + 150, 100, "/ck/step_100"),
        {**ev.interruption_event(t0 + 160, "completed", [], 0.95, ["every rank exited 0"]), "last_step": 100},
        ev.attempt_ended(t0 + 160, "7", "completed"),
        ev.campaign_ended(t0 + 160, "completed", "training completed"),
    ]
