"""Classification: evidence -> one class, blamed nodes and evidence, with causal priorities."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.classify import (
    NO_BLAME,
    Evidence,
    LogLine,
    RankExit,
    classify,
    node_state_is_bad,
)
from supervisor.decisions.detect import (
    GLOBAL_STALL,
    NODE_SILENT,
    NONFINITE_LOSS,
    RANK_STOPPED,
    DetectionEvent,
)
from supervisor.decisions.log_signatures import signatures_from_table

GLOO_CLOSED = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer"


def comm_errors_on(*nodes):
    return tuple(LogLine(GLOO_CLOSED, node=n, rank=i) for i, n in enumerate(nodes))


def test_preemption_by_job_state_blames_nobody_despite_the_fallout():
    e = Evidence(
        job_state="PREEMPTED",
        sigterm_ranks=(0, 1, 2, 3),
        rank_exits=(RankExit("node1", 0, 143), RankExit("node2", 2, 1)),
        log_lines=comm_errors_on("node1", "node2"),
    )
    result = classify(e)
    assert result.cls == ev.PREEMPTION and result.blamed_nodes == ()
    assert "PREEMPTED" in result.evidence[0]


def test_preemption_from_the_slurmstepd_line():
    line = LogLine("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-12-02T10:00:00 DUE TO PREEMPTION ***")
    assert classify(Evidence(log_lines=(line,))).cls == ev.PREEMPTION


def test_usr1_near_the_time_limit_is_a_timeout_and_far_from_it_a_preemption():
    near = classify(Evidence(end_time=1000.0, batch_signals=(("USR1", 940.0),), signal_lead_s=60))
    assert near.cls == ev.TIMEOUT and near.blamed_nodes == ()
    far = classify(Evidence(job_state="RUNNING", end_time=10_000.0, batch_signals=(("USR1", 940.0),), signal_lead_s=60))
    assert far.cls == ev.PREEMPTION and far.confidence == 0.5
    preempted = classify(Evidence(end_time=1000.0, preempt_time=930.0, batch_signals=(("SIGUSR1", 940.0),)))
    assert preempted.cls == ev.PREEMPTION


def test_a_dead_node_explains_its_peers_comm_errors_and_the_stall():
    e = Evidence(
        node_states={"node1": "ALLOCATED", "node2": "DOWN*"},
        detections=((5.0, DetectionEvent(GLOBAL_STALL, (0, 1, 2, 3), ("node1", "node2"))),),
        log_lines=comm_errors_on("node1", "node1"),
        rank_exits=(RankExit("node1", 0, 1), RankExit("node1", 1, 1)),
    )
    result = classify(e)
    assert result.cls == ev.NODE_FAILURE and result.blamed_nodes == ("node2",)


def test_a_down_node_outside_the_launch_does_not_end_it():
    """A node lost earlier and replaced by a spare stays DOWN in the allocation: the next launch's clean end is
    a completion, its crash the program's, not a node failure blamed on the excluded node (seen on the local
    cluster: every later launch was 'node_failure: Slurm node node2 is DOWN', relaunched until the budget ran
    out). A bad node of the launch itself still is a node failure."""
    states = {"node1": "MIXED", "node2": "DOWN+NOT_RESPONDING", "node3": "MIXED"}
    clean = (RankExit("node1", 0, 0), RankExit("node3", 1, 0))
    done = classify(Evidence(node_states=states, allocation_nodes=("node1", "node3"), rank_exits=clean))
    assert done.cls == ev.COMPLETED and done.blamed_nodes == ()
    crash = classify(Evidence(node_states=states, allocation_nodes=("node1", "node3"),
                              rank_exits=(RankExit("node3", 1, 3),)))  # fmt: skip
    assert crash.cls == ev.APP_ERROR and "node2" not in crash.blamed_nodes
    inside = classify(Evidence(node_states=states, allocation_nodes=("node1", "node2"), rank_exits=clean))
    assert inside.cls == ev.NODE_FAILURE and inside.blamed_nodes == ("node2",)
    unknown = classify(Evidence(node_states=states, rank_exits=clean))  # the launch's nodes unknown: as before
    assert unknown.cls == ev.NODE_FAILURE


def test_launch_failure_on_a_dead_node_blames_it():
    line = LogLine("srun: error: Task launch for StepId=12.0 failed on node node2: Communication connection failure")
    result = classify(Evidence(log_lines=(line,), job_nodes=("node1", "node2")))
    assert result.cls == ev.NODE_FAILURE and result.blamed_nodes == ("node2",)


def test_requeue_reason_names_the_failed_nodes():
    result = classify(Evidence(job_state="PENDING", job_reason="job requeued due to failure of node node[2-3]",
                               job_nodes=("node1", "node2", "node3")))  # fmt: skip
    assert result.cls == ev.NODE_FAILURE and result.blamed_nodes == ("node2", "node3")


def test_a_silent_agent_is_confirmed_by_slurm_or_stays_a_weak_blame():
    silent = (3.0, DetectionEvent(NODE_SILENT, (2, 3), ("node2",)))
    known = {"job_state": "RUNNING", "allocation_nodes": ("node1", "node2")}
    weak = classify(Evidence(detections=(silent,), node_states={"node1": "MIXED", "node2": "MIXED"}, **known))
    assert weak.cls == ev.NODE_FAILURE and weak.blamed_nodes == ("node2",) and weak.confidence == 0.5
    strong = classify(Evidence(detections=(silent,), node_states={"node2": "IDLE+NOT_RESPONDING"}, **known))
    assert strong.confidence > 0.9


def test_a_stopped_rank_is_a_hang_blaming_its_node_and_our_kill_is_not_a_crash():
    e = Evidence(
        detections=((10.0, DetectionEvent(RANK_STOPPED, (3,), ("node2",), evidence=("rank 3 stopped",))),),
        rank_exits=(RankExit("node2", 3, signal=9), RankExit("node1", 0, 143)),
        supervisor_killed=True,
    )
    result = classify(e)
    assert result.cls == ev.HANG and result.blamed_nodes == ("node2",) and result.evidence[0] == "rank 3 stopped"


def test_a_global_stall_blames_nobody():
    result = classify(Evidence(detections=((1.0, DetectionEvent(GLOBAL_STALL, (0, 1), ("node1", "node2"))),)))
    assert result.cls == ev.HANG and result.blamed_nodes == ()


def test_a_crash_before_the_stall_is_the_cause():
    e = Evidence(
        rank_exits=(RankExit("node1", 0, 1, t=10.0),),
        log_lines=(LogLine("Traceback (most recent call last):", "node1", 0), LogLine("ValueError: bad", "node1", 0)),
        detections=((20.0, DetectionEvent(GLOBAL_STALL, (1, 2, 3), ("node1", "node2"))),),
    )
    assert classify(e).cls == ev.APP_ERROR


def test_an_application_traceback_outranks_the_comm_errors_it_causes():
    lines = (LogLine("Traceback (most recent call last):", "node1", 0), LogLine("KeyError: 'x'", "node1", 0))
    lines += (LogLine(GLOO_CLOSED, "node2", 2), LogLine(GLOO_CLOSED, "node2", 3))  # ranks are unique in a step
    exits = (RankExit("node1", 0, 1), RankExit("node2", 2, 1), RankExit("node2", 3, 1))
    result = classify(Evidence(log_lines=lines, rank_exits=exits))
    assert result.cls == ev.APP_ERROR and result.blamed_nodes == ()


def test_a_killed_rank_is_the_root_of_its_peers_comm_errors():
    exits = (RankExit("node2", 3, 137), RankExit("node1", 0, 1), RankExit("node1", 1, 1), RankExit("node2", 2, 1))
    result = classify(Evidence(rank_exits=exits, log_lines=comm_errors_on("node1", "node1", "node2")))
    assert result.cls == ev.UNKNOWN and "SIGKILL" in result.evidence[0] and result.blamed_nodes == ()


def test_comm_errors_alone_are_a_comm_error():
    exits = (RankExit("node1", 0, 1), RankExit("node2", 1, 1))
    result = classify(Evidence(rank_exits=exits, log_lines=comm_errors_on("node1", "node2")))
    assert result.cls == ev.COMM_ERROR


def test_nan_loss_is_numerical_even_after_we_stopped_the_ranks():
    e = Evidence(
        detections=((4.0, DetectionEvent(NONFINITE_LOSS, (0,), ("node1",), evidence=("loss=nan",))),),
        rank_exits=(RankExit("node1", 0, 143),),
        supervisor_killed=True,
    )
    result = classify(e)
    assert result.cls == ev.NUMERICAL and result.blamed_nodes == ()


@pytest.mark.parametrize(
    "line,cls",
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", ev.HARDWARE),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", ev.HARDWARE),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", ev.APP_ERROR),
        ("[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(...)", ev.COMM_ERROR),
        ("node3:1234:1290 [0] NCCL WARN NET/IB : Got completion with error 12", ev.COMM_ERROR),
    ],
)
def test_log_signatures(line, cls):
    result = classify(Evidence(log_lines=(LogLine(line, "node3", 0),), rank_exits=(RankExit("node3", 0, 1),)))
    assert result.cls == cls
    assert result.blamed_nodes == (("node3",) if cls == ev.HARDWARE else ())


def test_clean_exits_with_teardown_noise_are_completed():
    exits = (RankExit("node1", 0, 0), RankExit("node2", 1, 0))
    assert classify(Evidence(rank_exits=exits, log_lines=comm_errors_on("node1"))).cls == ev.COMPLETED


def test_cancel_by_a_user():
    assert classify(Evidence(job_state="CANCELLED")).cls == ev.CANCELLED
    # the job's state: the supervisor killing its own step never cancels the job, so a cancel is the user's
    assert classify(Evidence(job_state="CANCELLED", supervisor_killed=True)).cls == ev.CANCELLED


def test_no_evidence_is_unknown_with_low_confidence():
    result = classify(Evidence())
    assert result.cls == ev.UNKNOWN and result.confidence < 0.5


def test_user_signatures_come_first_and_are_validated():
    sigs = signatures_from_table({r"MyTrainerDeadlock": ev.HANG, r"Connection closed by peer": ev.APP_ERROR})
    assert classify(Evidence(log_lines=(LogLine("MyTrainerDeadlock detected"),)), sigs).cls == ev.HANG
    assert classify(Evidence(log_lines=(LogLine(GLOO_CLOSED),)), sigs).cls == ev.APP_ERROR
    with pytest.raises(ValueError, match="unknown class 'oops'"):
        signatures_from_table({"x": "oops"})
    with pytest.raises(ValueError, match="invalid regular expression"):
        signatures_from_table({"(": ev.HANG})


@pytest.mark.parametrize(
    "state,bad", [("DOWN*", True), ("idle*", True), ("MIXED+NOT_RESPONDING", True), ("ALLOCATED", False),
                  ("IDLE+DRAIN", False), ("down", True), ("MIXED", False)],
)  # fmt: skip
def test_node_states(state, bad):
    assert node_state_is_bad(state) is bad


# ---- invariants over random evidence --------------------------------------------------------------------

NODES = ("node1", "node2", "node3")
_line = st.sampled_from(
    [GLOO_CLOSED, "Traceback (most recent call last):", "NCCL WARN x", "CUDA error: y", "Xid 79", "all good", ""]
)
_evidence = st.builds(
    Evidence,
    job_state=st.sampled_from([None, "RUNNING", "FAILED", "NODE_FAIL", "CANCELLED", "COMPLETED"]),
    rank_exits=st.lists(
        st.builds(RankExit, st.sampled_from(NODES), st.integers(0, 7), st.sampled_from([None, 0, 1, 134, 137, 139])),
        max_size=6,
    ).map(tuple),
    node_states=st.dictionaries(st.sampled_from(NODES), st.sampled_from(["IDLE", "DOWN*", "ALLOCATED"]), max_size=3),
    detections=st.lists(
        st.tuples(
            st.floats(0, 100),
            st.builds(
                DetectionEvent,
                st.sampled_from([GLOBAL_STALL, NODE_SILENT, NONFINITE_LOSS, RANK_STOPPED]),
                st.just((0,)),
                st.lists(st.sampled_from(NODES), min_size=1, max_size=2).map(tuple),
            ),
        ),
        max_size=3,
    ).map(tuple),
    log_lines=st.lists(st.builds(LogLine, _line, st.sampled_from(NODES)), max_size=5).map(tuple),
    sigterm_ranks=st.lists(st.integers(0, 3), max_size=3).map(tuple),
    supervisor_killed=st.booleans(),
)


@settings(max_examples=300)
@given(e=_evidence, preempt=st.booleans())
def test_invariants(e, preempt):
    if preempt:
        e = Evidence(**{**e.__dict__, "preempt_time": 50.0})
    result = classify(e)
    assert result.cls in ev.OUTCOMES
    assert 0.0 <= result.confidence <= 1.0 and result.evidence
    assert set(result.blamed_nodes) <= set(NODES)
    if result.cls in NO_BLAME or result.cls in (ev.COMPLETED, ev.COMM_ERROR):
        assert result.blamed_nodes == ()
    if preempt:
        assert result.cls == ev.PREEMPTION and result.blamed_nodes == ()  # preemption never blames nodes
    if any(node_state_is_bad(s) for s in e.node_states.values()) and not preempt and result.cls != ev.CANCELLED:
        assert result.cls == ev.NODE_FAILURE
        assert {n for n, s in e.node_states.items() if node_state_is_bad(s)} <= set(result.blamed_nodes)


def test_every_agent_silent_at_once_blames_no_node():
    silent = tuple((3.0, DetectionEvent(NODE_SILENT, (), (n,))) for n in ("node1", "node2"))
    result = classify(Evidence(detections=silent, allocation_nodes=("node1", "node2")))
    assert result.cls == ev.UNKNOWN and result.blamed_nodes == ()
    confirmed = classify(Evidence(detections=silent, allocation_nodes=("node1", "node2"), node_states={"node2": "DOWN"}))
    assert confirmed.cls == ev.NODE_FAILURE and confirmed.blamed_nodes == ("node2",)


def test_scancel_is_cancelled_even_though_slurm_moved_end_time_to_the_cancel():
    # On scancel, Slurm sets EndTime to the moment of the cancel, so the batch step's SIGTERM arrives "at" it.
    e = Evidence(job_state="CANCELLED", end_time=1000.0, batch_signals=(("TERM", 1000.2),))
    assert classify(e).cls == "cancelled"
    timed_out = Evidence(job_state="RUNNING", end_time=1000.0, scheduled_end=1000.0, batch_signals=(("TERM", 1000.2),))
    assert classify(timed_out).cls == "timeout"


def test_a_teardown_abort_after_a_normal_end_is_a_completed_run_and_anything_else_is_not() -> None:
    """Every rank's program ended normally (atexit, no unhandled exception), one then died of SIGABRT in the
    interpreter's teardown (gloo's abort at exit): the training completed, nobody relaunches it. The same
    death without the client's word, or a code of the program's own, stays a failure."""
    both = (RankExit("n1", 0, 0), RankExit("n2", 1, None, 6))
    done = classify(Evidence(rank_exits=both, ended_clean_ranks=(0, 1)))
    assert done.cls == ev.COMPLETED and not done.blamed_nodes
    assert any("died of SIGABRT after its program had ended normally" in line for line in done.evidence), done.evidence
    assert classify(Evidence(rank_exits=both, ended_clean_ranks=(0,))).cls == ev.APP_ERROR  # rank 1 raised
    code_134 = (RankExit("n1", 0, 0), RankExit("n2", 1, 134))  # srun's "Aborted": 128 + 6
    assert classify(Evidence(rank_exits=code_134, ended_clean_ranks=(0, 1))).cls == ev.COMPLETED
    own_code = (RankExit("n1", 0, 0), RankExit("n2", 1, 3))
    assert classify(Evidence(rank_exits=own_code, ended_clean_ranks=(0, 1))).cls == ev.APP_ERROR
    # srun ends the step's other tasks when one dies (--kill-on-bad-exit): rank 0, done too, is terminated
    peer_ended = (RankExit("n1", 0, None, 15), RankExit("n2", 1, None, 6))
    assert classify(Evidence(rank_exits=peer_ended, ended_clean_ranks=(0, 1))).cls == ev.COMPLETED
    assert classify(Evidence(rank_exits=peer_ended, ended_clean_ranks=(1,))).cls != ev.COMPLETED  # 0 was mid-run
