"""The decision core end to end, as the supervisor loop uses it: detect -> classify -> decide -> journal,
then history and ledger recomputed from the journal file alone."""

from __future__ import annotations

from supervisor import journal
from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence, LogLine, RankExit, classify
from supervisor.decisions.detect import (
    RANK_STOPPED,
    DetectConfig,
    Detector,
    LaunchView,
    NodeRanks,
    RankView,
    TimeoutConfig,
)
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.policy import (
    DUMP_STACKS,
    KILL_STEP,
    RESTART_IN_ALLOCATION,
    Allocation,
    History,
    decide,
)
from supervisor.decisions.tasklog import task_nodes
from supervisor.journal import Journal

NODE_OF = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def snapshot(t, stopped_rank=None, stopped_at=None):
    views = []
    for r, node in NODE_OF.items():
        frozen = stopped_rank == r and stopped_at is not None and t >= stopped_at
        last = stopped_at if frozen else float(int(t))
        views.append(
            RankView(r, node, 100 + r, int(last), "step", t - last, ewma_s=1.0, max_s=1.05,
                     state="stopped" if frozen else "sleeping")
        )  # fmt: skip
    return LaunchView(tuple(NodeRanks(n, 0.1, tuple(v for v in views if v.node == n)) for n in ("node1", "node2")))


def test_a_sigstopped_rank_goes_from_detection_to_a_journaled_restart(tmp_path):
    path = tmp_path / "journal.jsonl"
    detector = Detector(DetectConfig(timeouts=TimeoutConfig(step_floor_s=2.0, warmup_samples=10)))
    with Journal(path, clock=lambda: 0.0) as j:
        j.append(ev.campaign_started(0.0, "c1", ["python", "train.py"], "42"))
        j.append(ev.attempt_started(0.0, "42", 0, ["node1", "node2", "node3"], None))
        found, t = [], 0.0
        while not found:
            t += 0.25
            assert t < 60, "the stopped rank was never detected"
            found = detector.observe(snapshot(t, stopped_rank=3, stopped_at=30.0), t)
        assert [d.kind for d in found] == [RANK_STOPPED] and t - 30.0 <= detector.config.hang.stopped_grace_s + 0.25
        for d in found:
            j.append(ev.detection_event(d, t))
        history = History.fold(journal.read(path))
        evidence = Evidence(detections=tuple((t, d) for d in found), rank_exits=(RankExit("node2", 3, signal=9),),
                            supervisor_killed=True)  # fmt: skip
        interruption = classify(evidence)
        j.append(interruption.to_event(t))
        decision = decide(interruption, history, Allocation(("node1", "node2", "node3"), 2, step_running=True), now=t)
        for action in decision.actions:
            j.append(action.to_event(t))
    events = journal.read(path)
    actions = [e for e in events if e["type"] == ev.ACTION]
    kinds = [e["kind"] for e in actions]
    assert kinds.index(DUMP_STACKS) < kinds.index(KILL_STEP) < kinds.index(RESTART_IN_ALLOCATION)
    assert actions[-1]["params"]["exclude"] == ["node2"]
    assert History.fold(events).streaks == {ev.HANG: 1}
    ledger = Ledger.fold(events)
    assert 0 < ledger.score("node2", t) < ledger.config.threshold  # suspect, not yet excluded on requeue


def test_a_hardware_line_in_the_labelled_log_keeps_its_node_out_of_the_next_launch():
    layout = task_nodes(("node1", "node2", "node3"), 2)
    lines = ("4: step=41 loss=0.5", "2: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
             "0: RuntimeError: [pair.cc:598] Connection closed by peer [10.0.0.2]:4242")  # fmt: skip
    e = Evidence(job_state="RUNNING", task_nodes=layout, log_lines=tuple(LogLine(x) for x in lines),
                 rank_exits=(RankExit("node1", 0, 1), RankExit("node2", 2, 1)))  # fmt: skip
    interruption = classify(e)
    assert interruption.cls == ev.HARDWARE and interruption.blamed_nodes == ("node2",)
    decision = decide(interruption, History(), Allocation(("node1", "node2", "node3"), 2, step_running=True))
    restart = decision.actions[-1]
    assert restart.kind == RESTART_IN_ALLOCATION and "node2" not in restart.params["nodes"]
    assert Ledger.fold([interruption.to_event(1.0)]).excluded_nodes(2.0) == {"node2"}


def test_a_crash_that_keeps_to_one_node_is_blamed_on_it_through_the_journal(tmp_path):
    """Each launch's app error is journaled with where it happened; the second one on node2 alone blames node2."""
    path = tmp_path / "journal.jsonl"
    alloc = Allocation(("node1", "node2", "node3"), 2, step_running=False)
    blamed = []
    with Journal(path, clock=lambda: 0.0) as j:
        for t in (1.0, 2.0):
            history = History.fold(journal.read(path))
            e = Evidence(job_state="RUNNING", rank_exits=(RankExit("node2", 2, 1), RankExit("node1", 0, signal=9)),
                         log_lines=(LogLine("ValueError: bad value", "node2", 2),),
                         app_error_history=history.app_error_origins)  # fmt: skip
            interruption = classify(e)
            j.append(interruption.to_event(t))
            decision = decide(interruption, history, alloc, now=t)
            blamed.append((interruption.cls, interruption.blamed_nodes, decision.actions[-1].params.get("exclude")))
    assert blamed == [(ev.APP_ERROR, (), []), (ev.APP_ERROR, ("node2",), ["node2"])]
