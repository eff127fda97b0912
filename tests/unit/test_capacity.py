"""A requeue that Slurm could never start (the exclusions leave the job's partitions too few nodes) is held with
one line instead of waiting in the queue for ever (decisions/capacity.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions import policy
from supervisor.decisions.capacity import Room, fit_requeue, left_after, requeues

HINT = "forgive with `supervise nodes C --forgive NODE`, then `scontrol release 7`"
PARTITION = frozenset({"n1", "n2", "n3", "n4"})


def requeue(exclude: list[str], kind: str = policy.REQUEUE) -> policy.Decision:
    alert = policy.Action(policy.ALERT, "L1", (), "hardware on n1")
    action = policy.Action(kind, None, tuple(exclude), "hardware: requeue", {"exclude": exclude})
    return policy.Decision((alert, action), "pending", "hardware: requeueing")


def fit(decision: policy.Decision, room: Room | None, hard: set[str], **reasons: str) -> policy.Decision:
    return fit_requeue(decision, room, hard=frozenset(hard), reasons=reasons, forgive_hint=HINT)


def test_a_requeue_that_still_fits_is_left_alone():
    decision = requeue(["n1"])
    assert fit(decision, Room("batch", PARTITION, 3), {"n1"}) is decision


def test_too_few_nodes_left_holds_the_job_with_one_line_naming_each_excluded_node_and_the_way_back():
    room = Room("batch", PARTITION, 3, job_excluded=frozenset({"n4"}))
    out = fit(requeue(["n1"]), room, {"n1"}, n1="hardware in this run")
    assert out.state == "held"
    assert [a.kind for a in out.actions] == [policy.ALERT, policy.ALERT, policy.HOLD]
    assert out.actions[0].tier == "L2"  # a person must act: an alert, not only a log line
    assert out.actions[-1].params["exclude"] == ["n1"]  # still written: the node is broken
    line = out.message
    assert "\n" not in line and line.startswith("held: ")
    assert "needs 3 nodes" in line and "partition batch has 4" in line and "leaving 2" in line
    assert "n1 (hardware in this run)" in line and "n4 (excluded by the job)" in line
    assert line.endswith(HINT)


def test_slurms_own_requeue_is_followed_by_a_hold():
    out = fit(requeue(["n1", "n2"], policy.AWAIT_REQUEUE), Room("batch", PARTITION, 3), {"n1", "n2"})
    assert out.state == "held"
    assert out.actions[-1].kind == policy.AWAIT_REQUEUE and out.actions[-1].params["hold"] is True


def test_soft_suspects_are_used_again_rather_than_hold_the_job():
    """A hang's suspect (not struck out by the ledger) is not worth a campaign that can never start."""
    out = fit(requeue(["n1", "n2"]), Room("batch", PARTITION, 3), {"n1"})
    assert out.state == "pending"
    assert out.actions[-1].kind == policy.REQUEUE and out.actions[-1].params["exclude"] == ["n1"]
    assert "n2 not excluded" in out.message


def test_unknown_room_is_not_too_small():
    decision = requeue(["n1", "n2", "n3"])
    assert fit(decision, None, {"n1", "n2", "n3"}) is decision


def test_only_requeues_ask_for_the_room():
    assert requeues(requeue(["n1"])) and requeues(requeue([], policy.AWAIT_REQUEUE))
    relaunch = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION, None, ("n1",), "x"),), "running", "x")
    assert not requeues(relaunch)


def test_many_excluded_nodes_are_counted_not_all_named():
    nodes = frozenset(f"n{i}" for i in range(40))
    out = fit(requeue(sorted(nodes - {"n0"})), Room("batch", nodes, 2), set(nodes))
    assert "39 of them excluded" in out.message and "and 31 more" in out.message


_NODES = [f"n{i}" for i in range(8)]


@given(partition=st.sets(st.sampled_from(_NODES), min_size=1), job_excluded=st.sets(st.sampled_from(_NODES)),
       exclude=st.sets(st.sampled_from(_NODES)), hard=st.sets(st.sampled_from(_NODES)),
       job_nodes=st.integers(1, 8), slurm_requeues=st.booleans())  # fmt: skip
def test_a_requeue_is_either_startable_or_held_and_hard_blame_stays_out(partition, job_excluded, exclude, hard,
                                                                       job_nodes, slurm_requeues):  # fmt: skip
    room = Room("batch", frozenset(partition), job_nodes, frozenset(job_excluded))
    kind = policy.AWAIT_REQUEUE if slurm_requeues else policy.REQUEUE
    out = fit(requeue(sorted(exclude), kind), room, hard)
    last = out.actions[-1]
    final = frozenset(last.params["exclude"])
    assert final >= (frozenset(exclude) & frozenset(hard))  # a hard-blamed node is never let back in
    assert final <= frozenset(exclude)
    held = last.kind == policy.HOLD or last.params.get("hold") is True
    assert held == (out.state == "held")
    if not held:
        assert len(left_after(room, final)) >= job_nodes
    else:  # held only when even without the soft suspects Slurm could never start it
        assert final == frozenset(exclude)
        assert len(left_after(room, final & (frozenset(hard) | room.job_excluded))) < job_nodes
