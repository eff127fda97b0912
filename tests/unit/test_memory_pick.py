"""The memory tier's restore pick (decisions/memory_pick.py), as properties over arbitrary holdings: never an
incomplete, unverified, conflicting, wrong-world or two-launch set, never older than the filesystem checkpoint nor
newer than the step allowed, and the newest complete step whenever there is one; each shard read from a usable
node that holds it, its own when it can."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.memory_pick import Held, pick

NODES = ["n1", "n2", "n3", "n4"]
WORLD = 4

held_items = st.builds(Held, step=st.integers(0, 6), rank=st.integers(-1, WORLD), world=st.sampled_from([WORLD, 2]),
                       digest=st.sampled_from(["a", "b"]), verified=st.booleans(),
                       launch=st.sampled_from(["1", "2"]))  # fmt: skip
holdings = st.dictionaries(st.sampled_from(NODES), st.lists(held_items, max_size=12), max_size=4)


def oracle(held, usable, floor, ceiling):  # type: ignore[no-untyped-def]
    """The newest step complete by the definition (all of one launch), computed the plain way."""
    best = None
    for step in range(7):
        if floor is not None and step <= floor or ceiling is not None and step > ceiling:
            continue
        for launch in ("1", "2"):
            ok = True
            for rank in range(WORLD):
                digests = {h.digest for n in usable for h in held.get(n, ())
                           if (h.step, h.rank, h.world, h.launch) == (step, rank, WORLD, launch) and h.verified}
                ok &= len(digests) == 1
            if ok:
                best = step
    return best


@settings(max_examples=400, deadline=None)
@given(held=holdings, usable=st.sets(st.sampled_from(NODES)), floor=st.one_of(st.none(), st.integers(-1, 6)),
       homes=st.lists(st.sampled_from(NODES), min_size=WORLD, max_size=WORLD),
       ceiling=st.one_of(st.none(), st.integers(0, 6)))  # fmt: skip
def test_the_pick_is_the_newest_complete_verified_consistent_step_and_never_less(held, usable, floor, homes, ceiling):
    placement = dict(enumerate(homes))
    got, why = pick(held, world=WORLD, usable=usable, placement=placement, newest_filesystem_step=floor,
                    not_after=ceiling)  # fmt: skip
    want = oracle(held, usable, floor, ceiling)
    assert (got.step if got else None) == want, (why, held)
    assert why
    if got is None:
        return
    assert set(got.sources) == set(range(WORLD))
    for rank, node in got.sources.items():
        assert node in usable
        mine = (got.step, rank, WORLD, True, got.launch)
        assert any((h.step, h.rank, h.world, h.verified, h.launch) == mine for h in held[node])
        home_has = placement[rank] in usable and any(
            (h.step, h.rank, h.world, h.verified, h.launch) == mine for h in held.get(placement[rank], ()))
        assert (node == placement[rank]) == home_has  # its own node when it holds the shard: no copy
    assert got.fetches == sum(1 for r, n in got.sources.items() if placement[r] != n)


def test_the_reasons_say_what_is_missing() -> None:
    a = [Held(5, r, 2, "x", True) for r in range(2)]
    got, why = pick({"n1": a[:1], "n2": a[1:]}, world=2, usable=["n1"], placement={0: "n1", 1: "n1"},
                    newest_filesystem_step=3)  # fmt: skip
    assert got is None and why == "no complete snapshot: step 5 has 1 of 2 ranks' shards on usable nodes"
    got, why = pick({"n1": a}, world=2, usable=["n1"], placement={}, newest_filesystem_step=5)
    assert got is None and "not newer than the filesystem checkpoint (step 5)" in why
    got, why = pick({"n1": a}, world=4, usable=["n1"], placement={}, newest_filesystem_step=None)
    assert got is None and why.startswith("no verified snapshot of this world size")
    got, why = pick({"n1": a, "n2": [Held(5, 1, 2, "y", True)]}, world=2, usable=["n1", "n2"], placement={},
                    newest_filesystem_step=None)  # fmt: skip
    assert got is None and "1 of 2" in why  # two copies of rank 1 that disagree: neither is trusted
    got, why = pick({"n1": a[:1], "n2": a}, world=2, usable=["n1", "n2"], placement={0: "n1", 1: "n1"},
                    newest_filesystem_step=None)  # fmt: skip
    assert got is not None and got.sources == {0: "n1", 1: "n2"} and got.fetches == 1 and "step 5" in why


def test_one_steps_shards_of_two_launches_are_not_a_snapshot() -> None:
    """A relaunch from step 4 writes step 5 again: the dead launch's rank-0 shard of step 5 beside the new
    launch's rank-1 shard is not a state any training had."""
    old, new = Held(5, 0, 2, "x", True, launch="1"), Held(5, 1, 2, "y", True, launch="2")
    both4 = [Held(4, r, 2, "z", True, launch="1") for r in range(2)]
    got, _ = pick({"n1": [old, *both4], "n2": [new]}, world=2, usable=["n1", "n2"], placement={},
                  newest_filesystem_step=None)  # fmt: skip
    assert got is not None and (got.step, got.launch) == (4, "1")
    got, why = pick({"n1": both4}, world=2, usable=["n1"], placement={}, newest_filesystem_step=None, not_after=3)
    assert got is None and "up to step 3" in why
