"""How often a rank snapshots its state into memory ("auto"). Pure, stdlib only (the training side imports it).

A snapshot blocks the training only while its tensors are copied into reused CPU buffers (the write to the
node's memory runs in the background). Taking one every ``k`` steps costs ``cost / (k * step)`` of the
training's time, and a fault loses up to ``k`` steps: the smallest ``k`` that keeps the blocking share within
``budget`` (2 %, under the issue's 3 % slowdown goal, which also has the background write to pay for) loses the
fewest steps for that price. Ranks measure their own costs; they must snapshot the same steps, so the ranks
agree on the largest ``k`` (the training side does that once).
"""

from __future__ import annotations

import math

BUDGET = 0.02  # share of the training's time the blocking copies may take
MOST = 1000  # never fewer snapshots than one per this many steps (a step period mis-measured as ~0)


def every_k_steps(cost_s: float, step_s: float, budget: float = BUDGET, most: int = MOST) -> int:
    """Snapshot every k steps: the smallest k with ``cost_s <= budget * k * step_s`` (1 when free)."""
    if not (math.isfinite(cost_s) and math.isfinite(step_s)) or cost_s <= 0:
        return 1
    if step_s <= 0 or budget <= 0:
        return most
    return max(1, min(most, math.ceil(cost_s / (budget * step_s) - 1e-9)))


def parse_every(text: str) -> int | None:
    """``SUPERVISOR_MEMORY_EVERY``: "auto" (None: measure) or a whole number of steps >= 1."""
    value = text.strip().lower()
    if value in ("", "auto"):
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(f"memory snapshot cadence {text!r} is neither 'auto' nor a whole number of steps")
