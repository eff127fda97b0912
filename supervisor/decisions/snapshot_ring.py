"""Which memory snapshots a rank keeps: the newest few, for a fault, and a small ring of older ones, for a roll
back after the loss diverged (a NaN is seen a step or more after the update that caused it, and a loss spike
tens of steps after, so the newest snapshots may already hold the diverged weights).

For each ring distance ``d`` (default ~100 and ~500 steps) two snapshots are kept: the first one taken in the
current stretch of ``d`` steps (``step // d``) and the first one of the stretch before. One of them is always
about ``d`` to ``2d`` steps old (at worst ``d`` less the snapshot cadence; once the training is that old), and
the ring costs at most ``2 * len(ring)`` snapshots more, whatever the cadence. Steps newer than the one just written are another timeline (written
before a roll back): not kept. Pure, property-tested (tests/unit/test_snapshot_ring.py).
"""

from __future__ import annotations

from collections.abc import Iterable

RING = (100, 500)


def retained(steps: Iterable[int], newest: int, keep: int, ring: tuple[int, ...] = RING) -> set[int]:
    """The steps to keep of ``steps`` (every step the store has), ``newest`` just written."""
    past = sorted(s for s in set(steps) if s <= newest)
    kept = set(past[-keep:]) if keep > 0 else set()
    for d in ring:
        if d <= 0:
            continue
        current = newest // d
        for stretch in (current, current - 1):
            first = next((s for s in past if s // d == stretch), None)
            if first is not None:
                kept.add(first)
    return kept
