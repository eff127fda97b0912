"""Which committed checkpoints to delete: keep the last K, every Nth step, and always the newest valid."""

from __future__ import annotations

from collections.abc import Iterable


def steps_to_delete(valid_steps: Iterable[int], keep_last: int, keep_every: int = 0) -> list[int]:
    """Steps of valid checkpoints that retention may delete, oldest first.

    ``keep_last`` newest ones are kept (at least 1: the newest valid checkpoint is never deleted),
    and with ``keep_every`` > 0 every step divisible by it is kept forever (milestones).
    """
    steps = sorted(set(valid_steps))
    keep = set(steps[-max(1, keep_last):])
    if keep_every > 0:
        keep.update(s for s in steps if s % keep_every == 0)
    return [s for s in steps if s not in keep]
