"""Where the next launch runs (decisions/placement.py): the rules the loop applies between launches."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions import placement, policy
from supervisor.decisions.classify import Interruption
from supervisor.decisions.placement import TrainingLayout

LAYOUT = TrainingLayout(nodes=("node1", "node2", "node3"), tasks_per_node=2, spare_nodes=1)


def test_step_nodes_rotate_the_ranks_over_the_usable_nodes() -> None:
    assert placement.step_nodes(LAYOUT) == ("node1", "node2")
    assert placement.step_nodes(LAYOUT, shift=1) == ("node2", "node1")  # rank 0, 1 now on node2
    assert placement.step_nodes(LAYOUT, exclude=("node1",), shift=1) == ("node3", "node2")
    assert not placement.moved(LAYOUT, ("node1", "node2")) and placement.moved(LAYOUT, ("node2", "node1"))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(n=st.integers(1, 8), spares=st.integers(0, 3), shift=st.integers(0, 20), data=st.data())
def test_step_nodes_never_use_an_excluded_node_nor_more_than_the_training_needs(n: int, spares: int, shift: int,
                                                                                data: st.DataObject) -> None:
    nodes = tuple(f"n{i}" for i in range(n + spares))
    layout = TrainingLayout(nodes=nodes, tasks_per_node=1, spare_nodes=spares)
    exclude = data.draw(st.lists(st.sampled_from(nodes), unique=True, max_size=len(nodes)))
    chosen = placement.step_nodes(layout, exclude, shift)
    assert not set(chosen) & set(exclude)
    assert len(chosen) == min(n, len(nodes) - len(exclude)) and len(set(chosen)) == len(chosen)
    assert set(chosen) == set(placement.step_nodes(layout, exclude))  # a shift moves ranks, never nodes


def test_ledger_suspects_are_left_out_only_while_enough_nodes_remain() -> None:
    assert placement.ledger_exclusions(LAYOUT, {"node2", "node7"}) == ("node2",)  # the spare takes its place
    assert placement.ledger_exclusions(LAYOUT, {"node1", "node2"}) == ()  # too few left: the policy decides
    assert placement.ledger_exclusions(LAYOUT, set()) == ()


def test_the_relaunch_keeps_the_policys_exclusions() -> None:
    relaunch = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": ["node2"]}),), "running", "")
    requeue = policy.Decision((policy.Action(policy.REQUEUE, params={"exclude": ["node2"]}),), "running", "")
    assert placement.exclusions_of(relaunch) == ("node2",)
    assert placement.exclusions_of(requeue) == ()


def _interruption(cls: str, origin: tuple[str, ...], blamed: tuple[str, ...] = ()) -> Interruption:
    return Interruption(cls=cls, blamed_nodes=blamed, confidence=0.9, evidence=(), origin_nodes=origin)


def test_ranks_move_after_an_app_error_that_kept_to_one_node_and_blamed_nobody() -> None:
    assert placement.rank_shift_after(_interruption(ev.APP_ERROR, ("node1",))) == 1
    assert placement.rank_shift_after(_interruption(ev.APP_ERROR, ("node1", "node2"))) == 0  # everywhere: the program
    assert placement.rank_shift_after(_interruption(ev.APP_ERROR, ("node1",), ("node1",))) == 0  # blamed: left out
    assert placement.rank_shift_after(_interruption(ev.HANG, ("node1",))) == 0


def test_usable_nodes_leave_out_the_lost_ones() -> None:
    assert placement.usable_nodes(LAYOUT, {"node2"}) == ("node1", "node3")


def test_a_relaunch_leaves_out_nodes_still_quiet_only_when_enough_remain() -> None:
    """A switch lost: node2 was found lost, node3 (a spare, no rank on it) is quiet with no verdict yet. The
    relaunch goes to node1 and node4, not to node3 (it would fail and cost a relaunch more); with no node to spare
    the quiet one stays in (nobody is blamed on a silence not yet judged)."""
    four = TrainingLayout(nodes=("node1", "node2", "node3", "node4"), tasks_per_node=1, spare_nodes=2)
    out = placement.without_doubtful(four, {"node2"}, {"node3"})
    assert out == ("node2", "node3") and placement.step_nodes(four, out) == ("node1", "node4")
    three = TrainingLayout(nodes=("node1", "node2", "node3"), tasks_per_node=1, spare_nodes=1)
    assert placement.without_doubtful(three, {"node2"}, {"node3"}) == ("node2",)
    assert placement.without_doubtful(four, {"node2"}, set()) == ("node2",)


@given(st.sets(st.sampled_from(["a", "b", "c", "d", "e"])), st.sets(st.sampled_from(["a", "b", "c", "d", "e"])),
       st.integers(1, 5))  # fmt: skip
def test_leaving_out_the_doubtful_never_leaves_too_few_nodes(out: set[str], doubtful: set[str], train: int) -> None:
    layout = TrainingLayout(nodes=("a", "b", "c", "d", "e"), tasks_per_node=1, spare_nodes=5 - train)
    got = set(placement.without_doubtful(layout, out, doubtful))
    assert out <= got <= out | doubtful
    assert got == out or len(set(layout.nodes) - got) >= layout.train_nodes
