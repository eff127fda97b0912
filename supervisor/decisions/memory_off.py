"""When the memory tier turns itself off for the campaign: a node's store failed one of its ranks (the rank found
too little room before its first snapshot, or a write failed: ``checkpoint.memory_room``). One failed rank is
enough: a snapshot is complete only with every rank's shard, so the others' copies could never be restored, and a
full /dev/shm also starves data loaders and collectives of the shared memory they need. The filesystem tier is
unaffected; nothing else changes.
"""

from __future__ import annotations

import errno as errnos
import os
from collections.abc import Mapping, Sequence


def memory_off(failed: Mapping[str, Sequence[tuple[int, int]]]) -> str:
    """The journal's one line when any node reported a failed rank ("" while none did); ``failed``: node ->
    (rank, errno) pairs as the agents reported them."""
    rows = sorted((node, rank, code) for node, pairs in failed.items() for rank, code in pairs)
    if not rows:
        return ""
    node, rank, code = rows[0]
    cause = os.strerror(code) if code else "an unknown error"
    if code == errnos.ENOSPC:
        cause += " (node memory, /dev/shm, is too small for the snapshots and their buddy copies)"
    more = f" and {len(rows) - 1} more rank(s)" if len(rows) > 1 else ""
    return (f"memory snapshots off for the campaign: rank {rank} on {node}{more} could not keep snapshots in node "
            f"memory: {cause}; the filesystem checkpoints go on. Free /dev/shm or ask for more memory per node; "
            "a new campaign tries again")
