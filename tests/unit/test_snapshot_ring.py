"""The memory snapshots a rank keeps (decisions/snapshot_ring.py): the newest ``keep``, and per ring distance
``d`` one snapshot about ``d`` to ``2d`` steps old (``d`` less the cadence at worst) once the training is that old, at a bounded cost, whatever
the cadence; never a step of a later (abandoned) timeline. Simulated over a run: each step written, then the
store cut to what ``retained`` keeps, as the rank does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.snapshot_ring import retained


@settings(max_examples=300, deadline=None)
@given(every=st.integers(1, 40), last=st.integers(1, 3000), keep=st.integers(1, 4),
       ring=st.lists(st.integers(10, 600), max_size=3, unique=True).map(tuple))  # fmt: skip
def test_the_ring_always_holds_a_snapshot_between_d_and_2d_back_at_a_bounded_cost(every: int, last: int, keep: int,
                                                                                  ring: tuple[int, ...]) -> None:
    store: set[int] = set()
    for step in range(every, last + 1, every):
        store.add(step)
        store &= retained(store, step, keep, ring)
        assert len(store) <= keep + 2 * len(ring)
        assert sorted(store)[-keep:] == list(range(step - every * (min(keep, len(range(every, step + 1, every))) - 1),
                                                  step + 1, every))  # the newest ``keep`` are all there
        for d in ring:
            if step >= 2 * d + every:  # the training is old enough for the stretch before to have a snapshot
                assert any(d - every < step - s <= 2 * d for s in store), (d, step, sorted(store))


def test_steps_of_an_abandoned_timeline_are_not_kept() -> None:
    assert retained({10, 20, 30, 40, 50}, 20, 2, ()) == {10, 20}
    assert retained({10, 20, 30}, 20, 2, (100,)) == {10, 20}
    assert retained(set(), 5, 2) == set()
