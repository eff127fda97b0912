"""The exact goodput ledger on hand-written journals with known answers, and its one law: every millisecond of
the campaign is in exactly one bucket (the buckets sum to the wall clock), whatever the journal says."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.goodput import BUCKETS, ideal_step_ms, ledger
from supervisor.driver.context import Context
from supervisor.driver.progress import ProgressLog
from supervisor.journal import Journal, read
from supervisor.report_view import fold, render_text


def progress(t: float, launch: int, step: int, step_t: float | None = None) -> dict:
    return ev.step_progress(t, launch, step, t if step_t is None else step_t, 2)


def hang_then_completed(t0: float = 1000.0) -> list[dict]:
    """Launch 1: 10 s start-up, 30 steps at 1 s, a 2 s checkpoint at step 31, 30 more steps, 10 slow steps (2 s
    each), a hang detected 8 s after the last step. Launch 2 resumes from step 31: 10 s start-up, 30 steps at
    1 s, 10 slow steps (3 s each), completed."""
    return [
        ev.campaign_started(t0, "/c", ["train"], "7"),
        ev.attempt_started(t0, "7", 0, ["n1", "n2"], None),
        {**ev.step_launched(t0 + 5, 1, ["n1", "n2"]), "resume_step": None},
        progress(t0 + 16, 1, 1, t0 + 15),
        progress(t0 + 46, 1, 31, t0 + 45),
        ev.checkpoint_stall(t0 + 48, 1, 31, 2.0, t0 + 47, 2),
        ev.checkpoint_committed(t0 + 50, 31, "/ck/31"),
        progress(t0 + 78, 1, 61, t0 + 77),
        progress(t0 + 100, 1, 71, t0 + 97),
        {"type": "detection", "t": t0 + 105, "kind": "rank_hang", "duration_s": 8.0, "nodes": ["n2"]},
        {**ev.interruption_event(t0 + 105, "hang", ["n2"], 0.9, ["rank 1 silent 8 s"]), "last_step": 71},
        {**ev.step_launched(t0 + 110, 2, ["n1", "n2"], resume_from="/ck/31"), "resume_step": 31},
        progress(t0 + 121, 2, 32, t0 + 120),
        progress(t0 + 151, 2, 62, t0 + 150),
        progress(t0 + 180, 2, 72, t0 + 180),
        {**ev.interruption_event(t0 + 180, "completed", [], 0.95, ["every rank exited 0"]), "last_step": 72},
        ev.attempt_ended(t0 + 181, "7", "completed"),
        ev.campaign_ended(t0 + 181, "completed", "training completed"),
    ]


def test_known_answer_hang_then_completed() -> None:
    book = ledger(hang_then_completed(), now=0.0)
    assert book["wall_ms"] == 181_000
    assert book["ideal_step_s"] == 1.0  # the 2 s and 3 s steps are above median + 3 MAD
    assert book["buckets_ms"] == {"productive": 70_000, "slow_steps": 20_000, "lost_work": 50_000,
                                  "checkpoint": 2_000, "detection": 8_000, "teardown": 6_000, "queue": 0,
                                  "restart": 25_000, "preflight": 0, "other": 0}
    assert book["pre_launch_ms"] == {"restart": 5_000}
    first, second = book["rows"]
    assert first["span_ms"] == (1_005_000, 1_110_000) and second["span_ms"] == (1_110_000, 1_181_000)
    assert first["buckets_ms"]["lost_work"] == 50_000 and first["kept_steps"] == 30
    assert second["buckets_ms"]["slow_steps"] == 20_000 and second["kept_steps"] == 40
    assert book["by_class"] == {"hang": {"count": 1, "buckets_ms": {"lost_work": 50_000, "detection": 8_000,
                                                                    "teardown": 5_000, "restart": 10_000}}}


def test_report_json_carries_every_bucket_per_attempt_and_per_class() -> None:
    doc = fold(hang_then_completed(), now=0.0)
    g = doc["goodput"]
    assert g["wall_s"] == 181.0 and g["productive_s"] == 70.0 and g["ettr"] == round(70 / 181, 4)
    assert set(g["badput_s"]) == set(BUCKETS[1:])
    assert round(g["productive_s"] + sum(g["badput_s"].values()), 3) == g["wall_s"]
    rows = [a["goodput"] for a in doc["attempts"]]
    assert [r["wall_s"] for r in rows] == [105.0, 71.0]
    assert round(sum(r["productive_s"] + sum(r["badput_s"].values()) for r in rows), 3) == 181.0 - 5.0
    assert g["by_class"]["hang"] == {"interruptions": 1, "total_s": 73.0, "badput_s": {
        **dict.fromkeys(BUCKETS[1:], 0.0), "lost_work": 50.0, "detection": 8.0, "teardown": 5.0, "restart": 10.0}}
    assert set(g["before_first_launch_s"]) == set(BUCKETS[1:])


def test_a_supervisor_that_died_a_requeue_a_preflight_and_a_running_launch() -> None:
    """The first run's supervisor dies at 47 s (no interruption, no end); Slurm starts the job again at 100 s
    (no word in between: "other"); an 8 s preflight; the new launch resumes from step 21 and runs until now."""
    events = [
        ev.campaign_started(0.0, "/c", ["train"], "1"),
        ev.attempt_started(0.0, "1", 0, ["n1"], None),
        {**ev.step_launched(2.0, 1, ["n1"]), "resume_step": None},
        progress(5.0, 1, 1),
        progress(25.0, 1, 21),
        ev.checkpoint_stall(27.0, 1, 21, 2.0, 27.0, 1),
        progress(47.0, 1, 41),
        ev.attempt_started(100.0, "1", 1, ["n2"], None),
        ev.preflight(110.0, ["n2"], 8.0),
        {**ev.step_launched(112.0, 1, ["n2"], resume_from="/ck/21"), "resume_step": 21},
        progress(120.0, 1, 22),
    ]
    book = ledger(events, now=150.0)
    assert book["wall_ms"] == 150_000
    assert book["buckets_ms"] == {"productive": 50_000, "slow_steps": 0, "lost_work": 20_000, "checkpoint": 2_000,
                                  "detection": 0, "teardown": 0, "queue": 0, "restart": 17_000,
                                  "preflight": 8_000, "other": 53_000}
    assert book["rows"][0]["class"] == "unknown" and book["rows"][1]["class"] is None
    assert book["by_class"]["unknown"]["buckets_ms"] == {"lost_work": 20_000, "other": 53_000, "restart": 12_000,
                                                         "preflight": 8_000}


def test_a_clock_that_steps_back_creates_no_time() -> None:
    events = hang_then_completed()
    events[7] = {**events[7], "t": events[7]["t"] - 40.0, "step_t": events[7]["step_t"] - 40.0}  # 40 s back
    book = ledger(events, now=0.0)
    assert sum(book["buckets_ms"].values()) == book["wall_ms"] == 181_000
    assert all(v >= 0 for v in book["buckets_ms"].values())


def test_a_torn_tail_is_read_as_the_journal_without_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "journal.jsonl"
    events = hang_then_completed()
    with Journal(path) as journal:
        for e in events:
            journal.append(e)
    with path.open("a") as f:
        f.write('{"v": 1, "t": 1190.0, "type": "step_progr')  # the writer died mid-line
    back = read(path)
    assert ledger(back, now=0.0) == ledger(events, now=0.0)


def test_ideal_step_time_is_the_mean_below_median_plus_three_mad() -> None:
    assert ideal_step_ms([(100.0, 50), (102.0, 50), (5000.0, 1)]) == 101.0
    assert ideal_step_ms([]) is None
    assert ideal_step_ms([(7.0, 3)]) == 7.0


_KINDS = ["attempt_started", "step_launched", "progress", "stall", "interruption", "attempt_ended", "detection",
          "preflight", "committed"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_KINDS), st.floats(-30.0, 120.0), st.integers(0, 500),
                          st.floats(0.0, 50.0)), max_size=40),
       st.booleans(), st.floats(0.0, 500.0))
def test_every_millisecond_is_in_exactly_one_bucket(steps, ended, extra) -> None:  # type: ignore[no-untyped-def]
    """Any journal, in any order, with clocks going back and forth: the buckets sum to the wall clock to the
    millisecond, none is negative, and the rows (plus the time before the first launch) sum to the campaign."""
    t = 1000.0
    events: list[dict] = [ev.campaign_started(t, "/c", ["x"])]
    launch = 0
    for kind, dt, step, dur in steps:
        t += dt
        if kind == "attempt_started":
            events.append(ev.attempt_started(t, "1", 0, ["n1"], None))
        elif kind == "step_launched":
            launch += 1
            events.append({**ev.step_launched(t, launch, ["n1"]), "resume_step": step if step % 3 else None})
        elif kind == "progress":
            events.append(progress(t, launch, step, t - dur))
        elif kind == "stall":
            events.append(ev.checkpoint_stall(t, launch, step, dur, t - dur / 2, 1))
        elif kind == "interruption":
            events.append({**ev.interruption_event(t, "hang", [], 0.5, []), "last_step": step})
        elif kind == "attempt_ended":
            events.append(ev.attempt_ended(t, "1", "node_failure"))
        elif kind == "detection":
            events.append({"type": "detection", "t": t, "kind": "rank_hang", "duration_s": dur})
        elif kind == "preflight":
            events.append(ev.preflight(t, ["n1"], dur))
        else:
            events.append(ev.checkpoint_committed(t, step, f"/ck/{step}"))
    if ended:
        events.append(ev.campaign_ended(t + 1, "completed"))
    book = ledger(events, now=t + extra)
    assert sum(book["buckets_ms"].values()) == book["wall_ms"] >= 0
    assert all(v >= 0 for v in book["buckets_ms"].values())
    rows = [sum(r["buckets_ms"].values()) for r in book["rows"]]
    assert rows == [r["span_ms"][1] - r["span_ms"][0] for r in book["rows"]]
    assert sum(rows) + sum(book["pre_launch_ms"].values()) == book["wall_ms"]
    g = fold(events, now=t + extra)["goodput"]
    assert round(g["productive_s"] + sum(g["badput_s"].values()), 3) == g["wall_s"]


# ---------------------------------------------------------------------- the driver's side: records from the table


def _rank(pid: int, step: int, age: float, ckpt_ms: int = 0, ckpt_step: int = -1) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, step=step, beats=step + 1, beat_age_s=age, ckpt_ms=ckpt_ms, ckpt_step=ckpt_step)


def test_progress_log_journals_first_step_stalls_and_the_last_step() -> None:
    out: list[dict] = []
    now = [100.0]
    log = ProgressLog(Context.of(out.append, lambda: now[0]), every_s=30.0)
    log.launched(1)
    log.observe(SimpleNamespace(ranks=[]))
    assert out == []  # no rank stepped yet: still starting up
    log.observe(SimpleNamespace(ranks=[_rank(1, 0, 0.5), _rank(2, 0, 0.25)]))
    assert [(e["type"], e["step"], e["step_t"]) for e in out] == [("step_progress", 0, 99.5)]
    now[0] = 110.0
    log.observe(SimpleNamespace(ranks=[_rank(1, 10, 0.1), _rank(2, 11, 0.1)]))
    assert len(out) == 1  # not due yet
    now[0] = 112.0  # rank 2 spent 1.5 s in a checkpoint phase at step 12, rank 1 1.2 s
    log.observe(SimpleNamespace(ranks=[_rank(1, 12, 0.3, 1200, 12), _rank(2, 12, 0.2, 1500, 12)]))
    stall = out[1]
    assert (stall["type"], stall["step"], stall["stall_s"], stall["end_t"], stall["ranks"]) == \
        ("checkpoint_stall", 12, 1.5, 111.8, 2)
    assert out[2]["type"] == "step_progress" and out[2]["step"] == 12
    now[0] = 113.0
    log.observe(SimpleNamespace(ranks=[_rank(1, 13, 0.3, 1200, 12), _rank(2, 14, 0.2, 1500, 12)]), final=True)
    assert out[3]["type"] == "step_progress" and out[3]["step"] == 13 and out[3]["step_t"] == 112.7
    assert len(out) == 4


def test_after_a_warm_restart_a_kept_ranks_old_step_is_not_the_new_generations_first() -> None:
    """A warm restart's survivors keep their process, their slot and its last step (27) while they rendezvous and
    load; the new generation resumes at 26, so its first step is 27 too: only a step taken since (beats grew) is
    progress, or the restart's time would read as training (seen on Slurm: a first step 0.3 s after the order)."""
    out: list[dict] = []
    now = [200.0]
    log = ProgressLog(Context.of(out.append, lambda: now[0]), every_s=30.0)
    log.launched(2, carried={1: 28, 2: 28})  # both ranks at step 27 (28 beats) when the restart was ordered
    log.observe(SimpleNamespace(ranks=[_rank(1, 27, 0.1), _rank(2, 27, 0.1)]))
    assert out == []  # neither stepped since the order: still restarting
    now[0] = 201.0
    log.observe(SimpleNamespace(ranks=[SimpleNamespace(**{**vars(_rank(1, 27, 0.2)), "beats": 29}),
                                       SimpleNamespace(**{**vars(_rank(2, 27, 0.4)), "beats": 29})]))  # fmt: skip
    assert [(e["type"], e["step"], e["step_t"]) for e in out] == [("step_progress", 27, 200.8)]


def test_the_first_step_record_says_the_longest_state_load_of_this_generation_only() -> None:
    """The ranks' clients time their ``phase("restore")`` blocks; the launch's first progress record carries the
    slowest rank's load since the launch (a kept process's earlier loads left out), so the report can split the
    restart's start-up into the state load and the rest (rendezvous, model build, first step)."""
    out: list[dict] = []
    now = [300.0]
    log = ProgressLog(Context.of(out.append, lambda: now[0]), every_s=30.0)

    def rank(pid: int, beats: int, restore_ms: int, restores: int) -> SimpleNamespace:
        return SimpleNamespace(**{**vars(_rank(pid, 10 + beats, 0.1)), "beats": beats, "restore_ms": restore_ms,
                                  "restores": restores})  # fmt: skip

    # Rank 1's process loaded 5 s at its start (an earlier generation); rank 2 is a new process (a replacement).
    log.launched(3, carried={1: 30}, restored={1: (5000, 1)})
    log.observe(SimpleNamespace(ranks=[rank(1, 31, 5400, 2), rank(2, 1, 700, 1)]))
    assert out[0]["type"] == "step_progress" and out[0]["restore_s"] == 0.7  # max(0.4 s, 0.7 s)
    now[0] = 340.0
    log.observe(SimpleNamespace(ranks=[rank(1, 60, 9000, 3), rank(2, 30, 700, 1)]))
    assert out[1]["type"] == "step_progress" and "restore_s" not in out[1]  # only the start-up's record
    log.launched(4)  # a cold relaunch whose program marks no restore: nothing said, not a 0
    log.observe(SimpleNamespace(ranks=[rank(7, 1, 0, 0)]))
    assert out[2]["type"] == "step_progress" and "restore_s" not in out[2]


def _steady(stretches_s: list[float]) -> list[dict]:
    """One launch that completes: its first step at 10 s, then progress records 30 steps apart, each stretch
    lasting the given seconds (what the loop journals every 30 s)."""
    t0 = 1000.0
    events = [ev.campaign_started(t0, "/c", ["train"], "7"), ev.attempt_started(t0, "7", 0, ["n1"], None),
              {**ev.step_launched(t0, 1, ["n1"]), "resume_step": None}, progress(t0 + 10, 1, 1)]  # fmt: skip
    t, step = t0 + 10, 1
    for seconds in stretches_s:
        t, step = t + seconds, step + 30
        events.append(progress(t, 1, step))
    return events + [{**ev.interruption_event(t, "completed", [], 0.95, ["exit 0"]), "last_step": step},
                     ev.attempt_ended(t, "7", "completed"), ev.campaign_ended(t, "completed", "done")]  # fmt: skip


def test_slow_steps_are_judged_over_the_stretches_between_progress_records() -> None:
    """docs/goodput.md "The ledger": the ideal step time's samples are stretches (mean step time, weighted by its
    steps), not single steps. One slow step (10 s among 1 s steps) moves its stretch's mean past median + 3 MAD:
    it is left out of the ideal and its 9 s are slow_steps, as ml-goodput's per-step rule would have it. Slowness
    spread over every stretch (every 10th step 2 s) is in every mean: the ideal absorbs it and slow_steps stay 0
    where per-step samples would find 3 s per stretch. The limit the docs state, held here."""
    one_slow = ledger(_steady([30.0, 30.0, 39.0, 30.0, 30.0]), now=0.0)
    assert one_slow["ideal_step_s"] == 1.0 and one_slow["buckets_ms"]["slow_steps"] == 9_000
    assert one_slow["buckets_ms"]["productive"] == 150_000
    periodic = ledger(_steady([33.0] * 5), now=0.0)
    assert periodic["ideal_step_s"] == 1.1 and periodic["buckets_ms"]["slow_steps"] == 0
    per_step = ideal_step_ms([(1000.0, 27), (2000.0, 3)] * 5)  # what per-step records would give
    assert per_step == 1000.0


def test_the_ideal_step_is_not_shortened_by_stalls_seen_at_the_next_progress_record() -> None:
    """A real journal (test_interval_campaign on a loaded 2-core machine, 0.3 s steps, a save asked every 4 s): each
    stall's end is when the supervisor saw it, the very time of the next progress record, steps later. Placed by
    time, every save made a stretch of several steps in 0 s and the ideal came out 0.286 s; placed by step, each
    stall is taken from the stretch it was saved in."""
    t0 = 1796299921.756
    events = [
        ev.campaign_started(t0 - 1, "/c", ["train"], "7"),
        ev.attempt_started(t0 - 1, "7", 0, ["node1", "node2"], None),
        {**ev.step_launched(t0, 1, ["node1", "node2"]), "resume_step": None},
        progress(t0 + 12.560, 1, 1, 1796299933.972),
        ev.checkpoint_stall(t0 + 17.572, 1, 16, 0.126, 1796299939.080, 2),
        progress(t0 + 17.572, 1, 17, 1796299939.080),
        ev.checkpoint_stall(t0 + 23.511, 1, 31, 0.130, 1796299944.818, 2),
        progress(t0 + 23.511, 1, 35, 1796299944.818),
        ev.checkpoint_stall(t0 + 29.295, 1, 50, 0.074, 1796299950.767, 2),
        progress(t0 + 29.295, 1, 53, 1796299950.458),
        ev.checkpoint_stall(t0 + 31.959, 1, 60, 0.180, 1796299953.101, 2),
        progress(t0 + 31.959, 1, 60, 1796299953.101),
        {**ev.interruption_event(t0 + 32.5, "completed", [], 0.95, ["every rank exited 0"]), "last_step": 60},
        ev.attempt_ended(t0 + 33, "7", "completed"),
        ev.campaign_ended(t0 + 33, "completed", "training completed"),
    ]
    book = ledger(events, now=0.0)
    assert 0.3 <= book["ideal_step_s"] < 0.33
    assert sum(book["buckets_ms"].values()) == book["wall_ms"]


def test_stalls_seen_late_do_not_take_steps_out_of_their_stretch() -> None:
    """Another real journal of that test, kept whole (tests/golden/interval-journal.jsonl): there the second
    rank's stall of a checkpoint is journaled a pass later, at its last beat after it stepped on, and a stall ends
    exactly at the next progress record. By time the ideal came out 0.290 s; by step it is the program's."""
    from pathlib import Path

    events = read(Path(__file__).resolve().parents[1] / "golden" / "interval-journal.jsonl")
    book = ledger(events, now=0.0)
    assert 0.3 <= book["ideal_step_s"] < 0.33
    assert sum(book["buckets_ms"].values()) == book["wall_ms"]
    assert book["buckets_ms"]["checkpoint"] == 133 + 83 + 120 + 157  # one per checkpoint, its slowest rank's


def test_by_restart_tells_warm_restarts_from_relaunches_and_requeues() -> None:
    """A rank dies at 20 s: restarted warm (2 s to the order, 3 s to its first step); its training raises at 40 s:
    relaunched cold (5 s teardown, 7 s start-up); a requeue after a time limit at 70 s (20 s queue)."""
    events = [
        ev.campaign_started(0.0, "/c", ["train"], "1"),
        ev.attempt_started(0.0, "1", 0, ["n1", "n2"], None),
        {**ev.step_launched(1.0, 1, ["n1", "n2"]), "resume_step": None},
        progress(2.0, 1, 1),
        progress(19.0, 1, 18),
        {**ev.interruption_event(20.0, "unknown", [], 0.6, ["rank 1 was killed"]), "last_step": 18},
        {**ev.step_launched(22.0, 2, ["n1", "n2"]), "resume_step": 18, "warm": True, "generation": 1,
         "replaced_ranks": [1]},
        progress(25.0, 2, 19),
        progress(39.0, 2, 33),
        {**ev.interruption_event(40.0, "app_error", [], 0.9, ["ValueError"]), "last_step": 33},
        {**ev.step_launched(45.0, 3, ["n1", "n2"]), "resume_step": 33},
        progress(52.0, 3, 34),
        progress(69.0, 3, 51),
        {**ev.interruption_event(70.0, "timeout", [], 0.9, ["time limit"]), "last_step": 51},
        ev.attempt_ended(71.0, "1", "timeout"),
        ev.attempt_started(91.0, "1", 1, ["n1", "n2"], None),
        {**ev.step_launched(93.0, 1, ["n1", "n2"]), "resume_step": 51},
        progress(95.0, 1, 52),
    ]
    by = ledger(events, now=100.0)["by_restart"]
    assert set(by) == {"warm", "relaunch", "requeue"}
    assert by["warm"] == {"count": 1, "buckets_ms": {"detection": 1_000, "teardown": 2_000, "restart": 3_000}}
    assert by["relaunch"] == {"count": 1, "buckets_ms": {"detection": 1_000, "teardown": 5_000, "restart": 7_000}}
    assert by["requeue"]["count"] == 1 and by["requeue"]["buckets_ms"]["queue"] == 20_000
    doc = fold(events, now=100.0)
    assert doc["goodput"]["by_restart"]["warm"]["badput_s"]["restart"] == 3.0
    assert "  warm x1: 6.0 s (detection 1.0 s, teardown 2.0 s, restart 3.0 s)" in render_text(doc).splitlines()
