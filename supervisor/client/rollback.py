"""After the loss diverged (NaN), the supervisor rolls the training back to a snapshot taken before it and tells
the program which steps' batches to skip, the ones seen since that snapshot (one of them caused the divergence):
``SUPERVISOR_SKIP_STEPS=A-B``. The program, resumed at step A-1, draws the batches of steps A..B and trains on
none of them; a program that does not ask retrains on them (a divergence that is not the data's, e.g. a bit
flip, may not come back; a budget stops one that does)."""

from __future__ import annotations

import os

ENV_SKIP_STEPS = "SUPERVISOR_SKIP_STEPS"


def skip_steps() -> range:
    """The steps whose batches this launch must skip (an empty range when none, or unsupervised)."""
    first, sep, last = os.environ.get(ENV_SKIP_STEPS, "").partition("-")
    if not (sep and first.isdigit() and last.isdigit() and len(first) < 19 and len(last) < 19):
        return range(0)
    return range(int(first), int(last) + 1)
