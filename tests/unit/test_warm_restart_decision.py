"""Warm or cold after a restart in the allocation (decisions/warm_restart.py): warm only when every rank kept has let
go and waits, never after a fault during a warm restart, never when the world shrinks; the dead and the ranks on bad
nodes are the ones started again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.warm_restart import (
    COLD,
    SHOW_UP_S,
    WAIT,
    WARM,
    RankView,
    choose,
    missing_replacements,
    show_up_deadline_s,
)


def ranks(dead: tuple[int, ...] = (), waiting: tuple[int, ...] | None = None, world: int = 4,
          restartable: bool = True) -> list[RankView]:  # fmt: skip
    waiting = tuple(r for r in range(world) if r not in dead) if waiting is None else waiting
    return [RankView(r, f"node{r // 2}", r not in dead, restartable, r in waiting) for r in range(world)]


def test_a_dead_rank_whose_last_report_lost_its_flags_is_still_replaced_warm() -> None:
    """The rank killed for hanging is reported gone, its slot's flags lost with it (seen on the local Slurm): it
    is started anew anyway, so only the kept ranks' restartability counts."""
    view = ranks(dead=(1,))
    view[1] = RankView(1, view[1].node, False, False, False)
    got = choose(view, enabled=True, bad_nodes=(), shrinks=False, in_progress=False, waited_s=0.2)
    assert (got.kind, got.replace) == (WARM, (1,))


def test_a_killed_rank_is_started_again_and_the_waiting_survivors_keep_their_processes() -> None:
    got = choose(ranks(dead=(2,)), enabled=True, bad_nodes=(), shrinks=False, in_progress=False, waited_s=0.5)
    assert (got.kind, got.replace) == (WARM, (2,))
    assert got.warm and "3 of 4" in got.reason


def test_survivors_still_holding_the_failed_group_are_waited_for_then_cold() -> None:
    view = ranks(dead=(2,), waiting=(0, 1))
    assert choose(view, enabled=True, bad_nodes=(), shrinks=False, in_progress=False, waited_s=1.0).kind == WAIT
    late = choose(view, enabled=True, bad_nodes=(), shrinks=False, in_progress=False, waited_s=25.0)
    assert late.kind == COLD and "rank 3 did not let go" in late.reason


def test_the_ranks_on_a_blamed_or_lost_node_move_even_when_alive() -> None:
    got = choose(ranks(dead=(2,)), enabled=True, bad_nodes=("node1",), shrinks=False, in_progress=False, waited_s=0)
    assert (got.kind, got.replace) == (WARM, (2, 3))  # rank 3 shares the blamed node: a new process on a spare


def test_every_reason_for_cold_is_named() -> None:
    common = {"bad_nodes": (), "waited_s": 0.0}
    assert "off" in choose(ranks(dead=(1,)), enabled=False, shrinks=False, in_progress=False, **common).reason
    assert "second fault" in choose(ranks(dead=(1,)), enabled=True, shrinks=False, in_progress=True, **common).reason
    assert "shrinks" in choose(ranks(dead=(1,)), enabled=True, shrinks=True, in_progress=False, **common).reason
    assert "client.restartable" in choose(ranks(dead=(1,), restartable=False), enabled=True, shrinks=False,
                                          in_progress=False, **common).reason  # fmt: skip
    assert "nothing to keep" in choose(ranks(dead=(0, 1, 2, 3)), enabled=True, shrinks=False, in_progress=False,
                                       **common).reason  # fmt: skip
    assert "no rank" in choose([], enabled=True, shrinks=False, in_progress=False, **common).reason


views = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.booleans(), st.booleans()),
                 min_size=1, max_size=8).map(lambda rows: [RankView(i, *row) for i, row in enumerate(rows)])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(views, st.sets(st.sampled_from(["a", "b", "c"])), st.booleans(), st.booleans(), st.booleans(),
       st.floats(0, 100))  # fmt: skip
def test_warm_only_when_every_kept_rank_restarts_in_place_and_waits(
    view: list[RankView], bad: set[str], enabled: bool, shrinks: bool, in_progress: bool, waited: float
) -> None:
    got = choose(view, enabled=enabled, bad_nodes=bad, shrinks=shrinks, in_progress=in_progress, waited_s=waited)
    replaced = set(got.replace)
    if got.kind == WARM:
        assert enabled and not shrinks and not in_progress
        kept = [r for r in view if r.rank not in replaced]
        assert kept and all(r.alive and r.restartable and r.awaiting and r.node not in bad for r in kept)
        assert {r.rank for r in view if not r.alive or r.node in bad} == replaced
    elif got.kind == WAIT:
        assert waited < 20.0
    else:
        assert got.kind == COLD and got.reason


def test_which_decisions_a_warm_restart_carries_out() -> None:
    from supervisor.decisions import policy
    from supervisor.decisions.detect import GLOBAL_STALL, RANK_HANG, DetectionEvent
    from supervisor.decisions.warm_restart import applies, as_warm, hung_ranks, placement_after

    restart = policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": []})
    plain = policy.Decision((policy.Action(policy.DUMP_STACKS), policy.Action(policy.KILL_STEP), restart), "running", "")
    on = ("n0", "n1")
    assert applies(plain, "unknown", on) and applies(plain, "hang", on)
    assert not applies(plain, "numerical", on)  # a roll back: no rank died, nothing makes the ranks wait
    moved = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": ["n1"]}),), "running", "")
    assert not applies(moved, "hang", on)  # a node of the launch left out: a new placement
    assert applies(moved, "hang", ("n0", "n2")), "a node left out long ago (the ledger's) moves no rank"
    to_spare = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION,
                                              params={"exclude": ["n1"], "nodes": ["n0", "n2", "n3"]}),), "running", "")  # fmt: skip
    assert applies(to_spare, "node_failure", on), "a lost node's ranks move to a spare, the others stay"
    lost = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": [], "nodes": ["n0", "n3"]}),),
                           "running", "")  # fmt: skip
    assert placement_after(lost, on) == ("n0", "n3"), "our verdict's lost node is not offered: its ranks move"
    saved = policy.Decision((policy.Action(policy.STOP_STEP), restart), "running", "")
    assert not applies(saved, "unknown", on)
    requeued = policy.Decision((policy.Action(policy.REQUEUE),), "pending", "")
    assert not applies(requeued, "node_failure", on)
    assert hung_ranks("unknown", ()) == ()
    assert hung_ranks("hang", (DetectionEvent(RANK_HANG, ranks=(3, 1)),)) == (1, 3)
    assert hung_ranks("hang", (DetectionEvent(GLOBAL_STALL, ranks=(0, 1)),)) is None
    kinds = [a.kind for a in as_warm(plain, (3,)).actions]
    assert kinds == [policy.DUMP_STACKS, policy.KILL_RANKS, policy.WARM_RESTART]
    assert [a.kind for a in as_warm(plain).actions] == [policy.DUMP_STACKS, policy.WARM_RESTART]


def test_a_warm_launchs_watch_ends_once_every_live_rank_waits() -> None:
    from supervisor.decisions.warm_restart import survivors_wait

    def v(rank: int, alive: bool, awaiting: bool) -> RankView:
        return RankView(rank, "n", alive, True, awaiting)

    assert survivors_wait([v(0, True, True), v(1, False, False), v(2, True, True)])  # a rank died, the rest wait
    assert survivors_wait([v(0, True, True), v(1, True, True)])  # the training raised everywhere: nobody exits
    assert not survivors_wait([v(0, True, True), v(1, True, False)])  # rank 1 trains (or its death is not seen yet)
    assert not survivors_wait([v(0, False, False), v(1, False, False)])  # the launch ended: srun's exit says how
    assert not survivors_wait([])


def test_a_waiting_rank_whose_peers_stay_stuck_is_killed_after_a_grace() -> None:
    from supervisor.decisions.warm_restart import holding_back

    def v(rank: int, alive: bool, awaiting: bool) -> RankView:
        return RankView(rank, "n", alive, True, awaiting)

    stuck = [v(0, True, False), v(1, True, True), v(2, True, False)]
    assert holding_back(stuck, stuck_s=1.0) == ()  # peers fail within a second when its group really closed
    assert holding_back(stuck, stuck_s=6.0) == (1,)
    assert holding_back([v(0, True, True), v(1, False, False)], stuck_s=60.0) == ()  # a dead peer: nobody stuck
    assert holding_back([v(0, True, False), v(1, True, False)], stuck_s=60.0) == ()  # a hang: nobody waits


def test_a_rank_waiting_because_a_peer_failed_it_is_never_killed_and_the_stuck_peer_is_hung() -> None:
    """The live hang the backend saw first (gloo's timeout before the supervisor's warm-up timeout): ranks 0 and 2
    wait, their collectives having timed out on rank 1, which sleeps. Killing the waiting ones (as for a rank
    whose own code raised) would kill the victims: rank 1 is the hung one."""
    from supervisor.decisions.warm_restart import holding_back, hung_by_peers

    def v(rank: int, awaiting: bool, peer_failed: bool = False) -> RankView:
        return RankView(rank, "n", True, True, awaiting, peer_failed)

    timed_out = [v(0, True, True), v(1, False), v(2, True, True)]
    assert holding_back(timed_out, stuck_s=60.0) == ()
    assert hung_by_peers(timed_out, stuck_s=1.0) == () and hung_by_peers(timed_out, stuck_s=6.0) == (1,)
    own_error = [v(0, False), v(1, True), v(2, False)]  # rank 1 raised by itself: it holds its peers back
    assert hung_by_peers(own_error, stuck_s=60.0) == () and holding_back(own_error, stuck_s=60.0) == (1,)
    mixed = [v(0, True, True), v(1, True), v(2, False)]  # one waits on its own error: that is the one to kill
    assert holding_back(mixed, stuck_s=60.0) == (1,) and hung_by_peers(mixed, stuck_s=60.0) == ()


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=6),
       st.floats(0, 100))  # fmt: skip
def test_the_ranks_killed_for_holding_back_and_those_named_hung_never_meet(flags: list[tuple[bool, bool, bool]],
                                                                          stuck_s: float) -> None:  # fmt: skip
    from supervisor.decisions.warm_restart import holding_back, hung_by_peers

    views = [RankView(r, "n", alive, True, awaiting, peer) for r, (alive, awaiting, peer) in enumerate(flags)]
    held, hung = holding_back(views, stuck_s), hung_by_peers(views, stuck_s)
    assert not (held and hung), "one picture, two culprits"
    assert all(views[r].alive and views[r].awaiting and not views[r].peer_failed for r in held)
    assert all(views[r].alive and not views[r].awaiting for r in hung)


def test_the_training_raising_everywhere_restarts_every_rank_in_its_process() -> None:
    got = choose(ranks(dead=()), enabled=True, bad_nodes=(), shrinks=False, in_progress=False, waited_s=0)
    assert (got.kind, got.replace) == (WARM, ())


@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=1, max_size=4, unique=True),
       st.sets(st.sampled_from(["a", "b", "c", "d", "e", "f"])),
       st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), unique=True), st.booleans())  # fmt: skip
def test_placement_after_keeps_every_rank_that_can_stay_and_moves_only_the_left_out(
    running: list[str], exclude: set[str], nodes: list[str], fewer: bool
) -> None:
    from supervisor.decisions import policy
    from supervisor.decisions.warm_restart import placement_after

    params = {"exclude": sorted(exclude), "nodes": nodes, **({"fewer_nodes": True} if fewer else {})}
    decision = policy.Decision((policy.Action(policy.RESTART_IN_ALLOCATION, params=params),), "running", "")
    got = placement_after(decision, tuple(running))
    out = exclude | ({n for n in running if n not in nodes} if nodes else set())  # a lost node is not offered
    spares = [n for n in nodes if n not in running and n not in out]
    if fewer or len([n for n in running if n in out]) > len(spares):
        assert got is None
        return
    assert got is not None and len(got) == len(running) and len(set(got)) == len(got)
    for old, new in zip(running, got, strict=True):
        assert new == old if old not in out else (new in spares)
    assert not set(got) & out


def test_under_torchrun_a_dead_workers_node_mates_are_doomed_with_it() -> None:
    from supervisor.decisions.warm_restart import doomed_with_their_node

    views = [RankView(0, "a", True, True, True), RankView(1, "a", True, True, False),
             RankView(2, "b", False, True, False), RankView(3, "b", True, True, True)]  # fmt: skip
    assert doomed_with_their_node(views) == (3,)
    assert doomed_with_their_node([v for v in views if v.node == "a"]) == ()


@given(st.lists(st.tuples(st.integers(0, 7), st.floats(0, 1000)), max_size=8), st.sets(st.integers(0, 7)),
       st.floats(0, 2000), st.none() | st.floats(0, 500))
def test_a_replacement_is_missing_only_past_the_deadline_and_never_when_it_showed_up_or_the_start_up_is_unknown(
        started: list[tuple[int, float]], shown: set[int], now: float, startup_s: float | None) -> None:  # fmt: skip
    deadline = show_up_deadline_s(startup_s)
    assert (deadline is None) == (startup_s is None)
    if deadline is not None:
        assert deadline >= SHOW_UP_S and deadline >= 2 * startup_s
    missing = missing_replacements(started, shown, now, deadline)
    assert list(missing) == sorted(set(missing)) and not set(missing) & shown
    for rank in missing:
        assert deadline is not None and any(r == rank and now - t >= deadline for r, t in started)
    for rank, t in started:
        if deadline is not None and rank not in shown and now - t >= deadline:
            assert rank in missing
