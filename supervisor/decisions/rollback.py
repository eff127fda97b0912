"""After a diverged loss (NaN/Inf) the policy rolls back (``RESTART_IN_ALLOCATION`` with ``rollback``): the
relaunch resumes from the newest snapshot or checkpoint before the divergence (the memory pick and the
checkpoint quarantine leave out everything after the last finite loss) and skips the batches of every step
since the one it resumes from up to the newest step the diverged launch reached: one of them caused it (PaLM and
OPT recovered from loss spikes the same way). The program learns the range from ``client.skip_steps()``."""

from __future__ import annotations


def skip_range(resumed_at: int | None, reached: int | None) -> tuple[int, int] | None:
    """(first, last) step whose batch to skip, when the launch resumes at ``resumed_at`` (None: from scratch)
    after a launch that reached step ``reached``; None when there is nothing to skip or ``reached`` is unknown."""
    if reached is None:
        return None
    first = (resumed_at or 0) + 1
    return (first, reached) if reached >= first else None
